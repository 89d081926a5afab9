"""The course: one room per notebook (chapter/<slug>.py beside notebooks/NN_<slug>.ipynb and
quizzes/NN_<slug>.yaml), the quiz and troubleshooting machinery, and the facts that prose pins.
The library below (course_utils.*) never imports this floor (tests/test_layout.py)."""
