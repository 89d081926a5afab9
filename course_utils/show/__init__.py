"""What the library draws and prints: figures (plots, path, placement), tables and the result reports."""
