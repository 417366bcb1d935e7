"""The typed config (YAML layers, ``--set``, validation) and the plug-in code loaded from outside mpifed."""
