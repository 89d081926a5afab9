"""The quiz: the widget, its question banks, grading and its static copy."""
