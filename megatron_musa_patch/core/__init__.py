"""The framework every feature is written against, knowing no feature: the hook contract
(``hookspecs``), a feature's declaration (``feature``), the settings read once (``settings``),
the switches (``toggles``), the patch records and their application (``registry``), the plugin
manager (``plugins``), the per-run state handed to hooks (``session``), the patch table
(``table``) and the errors (``errors``). See docs/architecture.md."""
