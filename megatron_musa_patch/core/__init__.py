"""The framework every feature is written against, knowing no feature: the hook contract
(``hookspecs``), a feature's declaration (``feature``), the settings read once (``settings``),
the switches (``toggles``), the patch records and their application (``records``, ``gate``,
``registry``), the plugin manager (``plugins``) and the patch table (``table``). Below it:
``upstream`` and ``base``; above it: ``device``, then the ``session`` handed to hooks. See
docs/architecture.md."""
