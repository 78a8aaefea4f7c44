"""The rules: one module per rule, each registering itself by subclassing `Rule`."""
