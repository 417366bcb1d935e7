"""The typed config, a module a job (schema, YAML layers, ``--set``, validation, fingerprints, the reference;
``config`` loads it), and the plug-in code loaded from outside mpifed."""
