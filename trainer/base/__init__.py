"""The torch-free base every layer stands on: errors and exit codes, redaction, storage URIs,
atomic outputs, the version, and the typed-config machinery.

Modules here import only each other and the standard library or pyarrow: never torch, never
anything else of ``trainer``. That is what lets ``trainer.launch`` and ``pipelines`` use them
in a process that never loads torch (``tests/unit/test_layers.py`` holds them to it).
"""
