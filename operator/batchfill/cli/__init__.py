"""The command line: one module per command (``batchfill demo | run | serve | plan | profile | simulate | crd |
dev-cluster``); each imports what it needs when it runs."""
