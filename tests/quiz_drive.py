"""Drive the quiz and checklist widgets in Python as a learner would: pick, tick or type, press Check,
read the feedback. One copy, used by tests/test_quiz.py under the installed ipywidgets (8.x) and by
tests/test_quiz_ipywidgets7.py, which runs this file as a script under ipywidgets 7.7 (Colab's) and
checks what it prints (JSON) with `check_session`, the same checks test_quiz.py makes in-process.
"""

from __future__ import annotations

import html
import json
import re
import sys

BANK = "01_gradient_checkpointing"  # a real bank with all three question types


def check(qw, answer) -> str:
    """Set a question's controls as a learner would (a choice index, a list of indexes, or the text
    typed in the number box), press Check, and return the feedback as the learner reads it."""
    qw.select(answer)
    qw.check_button.click()
    return qw.feedback_text


def first(quiz, qtype: str):
    """The quiz's first question widget of a type ("single", "multiple", "numeric")."""
    return next(w for w in quiz.questions if w.question.type == qtype)


def wrong_choice(question) -> int:
    """The index of the question's first wrong choice."""
    return next(i for i, c in enumerate(question.choices) if not c.correct)


def wrong_number(question) -> float:
    """A wrong number for a numeric question: its first common wrong answer, else clearly off."""
    if question.wrong_answers:
        return question.wrong_answers[0].value
    return question.answer + 2 * question.tolerance + 1


def checklist_parts(widget):
    """The checklist widget's hardware dropdown, its checkboxes (in CHECKLIST order) and its output."""
    device, boxes, out = widget.children
    return device, list(boxes.children), out


def table_rows(report_html: str) -> list[list[str]]:
    """The rows of the checklist report's HTML table (the header first), each a list of its cells' text."""
    return [[html.unescape(c) for c in re.findall(r"<t[dh]\b[^>]*>(.*?)</t[dh]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", report_html)]


def picked(locked_html: str) -> list[tuple[str, str]]:
    """(style, text) of each answer a locked question's view marks as picked."""
    return [(style, html.unescape(re.sub(r"<[^>]+>", "", text)))
            for style, text in re.findall(r'<div class="course-quiz-picked" style="([^"]*)">(.*?)</div>', locked_html)]


def lock_state(qw) -> dict:
    """What a learner sees of a question's lock: the locked view's HTML, and what is displayed."""
    return {"view": qw.locked_view.value, "view_display": qw.locked_view.layout.display,
            "controls_display": qw.answer_box.layout.display, "check_display": qw.check_button.layout.display,
            "disabled": all(w.disabled for w in (qw.controls if isinstance(qw.controls, list) else [qw.controls]))
            and qw.check_button.disabled}


def learner_session(bank: str = BANK) -> dict:
    """One bank's quiz: a choice, a multiple-answer and a numeric question answered wrong, then right,
    each by pressing Check; then the checklist widget, one item unticked and the hardware changed.
    Returns what the learner sees, as plain data (it crosses a process boundary as JSON)."""
    import ipywidgets

    from course_utils.chapter.complete_recipe import checklist_widget
    from course_utils.chapter.quiz.widget import make_quiz
    from course_utils.recipe import Recipe

    quiz = make_quiz(bank)
    single, multi, num = first(quiz, "single"), first(quiz, "multiple"), first(quiz, "numeric")
    right_multi = list(multi.question.right_choices)
    seen = {
        "ipywidgets": ipywidgets.__version__, "ipywidgets_file": ipywidgets.__file__,
        "bundle": sorted(quiz._repr_mimebundle_()),
        "single_wrong": check(single, wrong_choice(single.question)),
        "single_right": check(single, single.question.right_choices[0]),
        "single_locked": lock_state(single),
        "multi_partial": check(multi, right_multi[:1]),
        "multi_partial_locked": lock_state(multi),
        "multi_right": check(multi, right_multi),
        "multi_locked": lock_state(multi),
        "multi_ticked": sorted(j for j, box in zip(multi.order, multi.controls) if box.value),
        "numeric_wrong": check(num, str(wrong_number(num.question))),
        "numeric_right": check(num, str(num.question.answer)),
        "numeric_locked": lock_state(num),
        "score": list(quiz.score), "score_label": quiz.score_label.value,
    }
    quiz.reset_button.click()  # Start over
    seen["score_after_reset"] = list(quiz.score)
    seen["single_after_reset"] = lock_state(single)

    recipe = Recipe(model="llama-3.1-8b", micro_batch=1, max_seq_length=512, load_in_4bit=True,
                    gradient_checkpointing=True, grad_accum=8, optimizer="paged_adamw_8bit", precision="bf16")
    widget = checklist_widget(recipe, hardware="t4")
    seen["checklist_bundle"] = sorted(widget._repr_mimebundle_())
    device, boxes, out = checklist_parts(widget)
    seen["checklist_ticked"] = [box.value for box in boxes]
    seen["checklist_t4"] = out.value
    boxes[0].value = False  # untick "Use QLoRA"
    seen["checklist_no_qlora"] = out.value
    device.value = "cpu"
    seen["checklist_cpu"] = out.value
    return seen


def check_session(seen: dict, bank: str = BANK) -> None:
    """Assert that `learner_session` saw the right feedback (graded from the bank itself)."""
    from course_utils.chapter.quiz.widget import _plain
    from course_utils.chapter.quiz.bank import load_bank

    questions = load_bank(bank).questions
    single, multi, num = (next(q for q in questions if q.type == t) for t in ("single", "multiple", "numeric"))
    right, wrong = single.right_choices[0], wrong_choice(single)
    assert {"application/vnd.jupyter.widget-view+json", "text/plain", "text/markdown"} <= set(seen["bundle"])

    assert "Not quite" in seen["single_wrong"] and _plain(single.choices[wrong].explanation)[:60] in seen["single_wrong"]
    assert _plain(single.choices[right].explanation)[:60] not in seen["single_wrong"]  # not given away
    assert "Correct" in seen["single_right"] and _plain(single.choices[right].explanation)[:60] in seen["single_right"]
    # a right answer is locked and reads as right: the controls (which a disabled widget draws pale grey)
    # are disabled and hidden, Check too; the locked view marks the right choice in bold green with a check
    # mark, and shows the other choices unmarked
    green = "color:#1a7f37"
    lock = seen["single_locked"]
    assert lock["disabled"] and lock["view_display"] is None
    assert lock["controls_display"] == "none" and lock["check_display"] == "none"
    [(style, text)] = picked(lock["view"])
    assert green in style and "font-weight:bold" in style and "\u2714" in text
    assert _plain(single.choices[right].text) in text
    for c in single.choices:
        assert _plain(c.text) in html.unescape(re.sub(r"<[^>]+>", "", lock["view"]))
    assert not seen["multi_partial_locked"]["disabled"] and seen["multi_partial_locked"]["view_display"] == "none"
    assert seen["multi_partial_locked"]["controls_display"] is None  # a wrong answer is not locked
    lock = seen["multi_locked"]
    assert lock["disabled"] and lock["view_display"] is None and lock["controls_display"] == "none"
    marked = picked(lock["view"])
    assert len(marked) == len(multi.right_choices) and all(green in style for style, _ in marked)
    assert sorted(_plain(t).replace(" \u2714", "")[2:] for _, t in marked) == sorted(
        _plain(multi.choices[i].text) for i in multi.right_choices)
    lock = seen["numeric_locked"]
    [(style, text)] = picked(lock["view"])
    assert lock["view_display"] is None and green in style and f"{num.answer:g}" in text and num.unit in text
    reset = seen["single_after_reset"]  # Start over unlocks: the controls are back, the locked view gone
    assert not reset["disabled"] and reset["view"] == "" and reset["view_display"] == "none"
    assert reset["controls_display"] is None and reset["check_display"] is None

    assert "Not quite" in seen["multi_partial"] and "missing" in seen["multi_partial"]
    assert "Correct" in seen["multi_right"] and seen["multi_ticked"] == list(multi.right_choices)

    assert "Not quite" in seen["numeric_wrong"]
    if num.wrong_answers:
        assert _plain(num.wrong_answers[0].explanation)[:60] in seen["numeric_wrong"]
    assert "Correct" in seen["numeric_right"] and _plain(num.explanation)[:60] in seen["numeric_right"]

    assert seen["score"] == [3, len(questions)] and f"Score: 3/{len(questions)}" in seen["score_label"]
    assert seen["score_after_reset"] == [0, len(questions)]

    assert {"application/vnd.jupyter.widget-view+json", "text/plain", "text/markdown"} <= set(seen["checklist_bundle"])
    assert all(seen["checklist_ticked"][:5])  # QLoRA, checkpointing, accumulation, 8-bit optimizer, bf16
    # the report is an HTML table, one row per item (no <pre> of 100-character lines, which wrapped mid-word
    # beside the checkboxes at 1366 px), its statements as text that wraps between words
    from course_utils.chapter.complete_recipe import CHECKLIST

    for state in ("checklist_t4", "checklist_no_qlora", "checklist_cpu"):
        report = seen[state]
        assert "<pre" not in report and 'class="course-checklist-report"' in report, state
        rows = table_rows(report)
        assert rows[0] == ["followed", "checklist item", "estimated peak without it"], state
        assert [r[1] for r in rows[1:]] == [item for item, _, _ in CHECKLIST], state
    qlora = CHECKLIST[0][0]
    assert table_rows(seen["checklist_t4"])[1][:2] == ["\u2611 yes", qlora] and "fits" in seen["checklist_t4"]
    assert re.fullmatch(r"\d+\.\d\d GiB \(\+\d+\.\d\d\)", table_rows(seen["checklist_t4"])[1][2])
    assert table_rows(seen["checklist_no_qlora"])[1] == ["\u2610 no", qlora, "\u2013"]
    assert "DOES NOT FIT" in seen["checklist_no_qlora"]
    assert "on CPU" in seen["checklist_cpu"]


if __name__ == "__main__":  # run by tests/test_quiz_ipywidgets7.py in a subprocess
    json.dump(learner_session(*sys.argv[1:2]), sys.stdout)
