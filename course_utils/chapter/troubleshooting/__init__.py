"""TROUBLESHOOTING.md: the guide's entries (guide) and the course code that produces each quoted message (sources)."""
