"""The base layer, below every other module: the errors the layer raises on purpose
(``errors``), the package's release (``version``) and the names of its environment variables
(``env_names``)."""
