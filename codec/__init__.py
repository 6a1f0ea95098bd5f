from tensorgate.codec import purepython

if purepython.wanted():  # before any compiled module of ours is imported (server and batcher import us first)
    purepython.install()
