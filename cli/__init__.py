"""cli: the `nosync` command. Thin: parse, call the library, render."""
