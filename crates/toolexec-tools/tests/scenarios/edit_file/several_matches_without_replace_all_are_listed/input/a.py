x = foo()
y = 1
z = foo()

w = foo()
