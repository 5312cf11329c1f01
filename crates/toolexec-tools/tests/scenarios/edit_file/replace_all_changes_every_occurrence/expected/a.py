x = baz()
y = baz()
z = bar(baz)
