x = foo()
y = foo()
z = bar(foo)
