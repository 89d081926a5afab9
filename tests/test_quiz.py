"""Quizzes: the shipped banks, validation errors, grading, the widget driven in Python, the text fallback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from course_utils.chapter.quiz import widget as Q
from course_utils.chapter.quiz import bank as quiz_bank
from course_utils.chapter.quiz.bank import QuizError, all_banks, load_bank
from course_utils.chapter.quiz.grade import grade
from course_utils.chapter.quiz.widget import show_quiz
from quiz_drive import check, check_session, first, learner_session, picked, wrong_choice

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_BANKS = (
    "00_where_memory_goes", "01_gradient_checkpointing", "02_gradient_accumulation", "03_efficient_optimizers",
    "04_mixed_precision", "05_qlora_4bit", "06_sequence_length_and_batch", "07_complete_recipe",
    "08_after_training", "09_beyond_the_recipe", "10_toward_the_limit", "11_more_than_one_gpu",
)
CHAPTER_BANKS = NOTEBOOK_BANKS[:-1]  # the chapter quiz draws from 00-10; 11 goes beyond the chapter


# --- the shipped banks ---------------------------------------------------------------------------
SPLIT_BANKS = ("08_after_training", "09_beyond_the_recipe", "10_toward_the_limit")  # issue 30 split two banks of 7


def test_every_notebook_has_a_valid_bank_of_at_least_five_questions():
    banks = {b.name: b for b in all_banks()}  # validates every file and cross-bank id uniqueness
    assert set(NOTEBOOK_BANKS) <= set(banks) and set(banks) == set(NOTEBOOK_BANKS)
    for name in NOTEBOOK_BANKS:  # the split's banks: at least 3, each notebook under 30 minutes (test_study_time)
        assert len(banks[name]) >= (3 if name in SPLIT_BANKS else 5), name
    assert sum(len(b) for b in banks.values()) >= 45


def test_banks_use_every_question_type_and_ids_are_unique_across_banks():
    questions = [q for b in all_banks() for q in b.questions]
    assert {q.type for q in questions} == set(Q.TYPES)
    ids = [q.id for q in questions]
    assert len(ids) == len(set(ids))


def test_quiz_readme_counts_match_the_banks():
    readme = (ROOT / "quizzes" / "README.md").read_text()
    for b in all_banks():
        assert f"| `{b.name}` | {len(b)} |" in readme, f"quizzes/README.md: update the count for {b.name}"
    assert f"| **all** | **{sum(len(b) for b in all_banks())}** |" in readme


def test_right_answers_are_not_always_shown_first():
    order_positions = [Q.choice_order(q).index(q.right_choices[0])
                       for b in all_banks() for q in b.questions if q.type == "single"]
    assert sum(p == 0 for p in order_positions) < len(order_positions) / 2
    q = load_bank("01_gradient_checkpointing").questions[0]
    assert Q.choice_order(q) == Q.choice_order(q)  # the same every time
    assert sorted(Q.choice_order(q)) == list(range(len(q.choices)))


def test_load_bank_by_prefix_and_unknown_name():
    assert load_bank("01").name == "01_gradient_checkpointing"
    assert load_bank("01_gradient_checkpointing.ipynb").name == "01_gradient_checkpointing"
    with pytest.raises(KeyError, match="00_where_memory_goes"):
        load_bank("99_nothing")
    with pytest.raises(KeyError):
        load_bank("0")  # matches every bank: ambiguous


# --- validation ----------------------------------------------------------------------------------
def valid_bank() -> dict:
    return {"title": "Test bank", "questions": [
        {"id": "t-single", "type": "single", "prompt": "Which is right?", "choices": [
            {"text": "right", "correct": True, "explanation": "right because"},
            {"text": "wrong", "correct": False, "explanation": "wrong because"},
            {"text": "also wrong", "correct": False, "explanation": "also wrong because"}]},
        {"id": "t-multi", "type": "multiple", "prompt": "Which are right?", "choices": [
            {"text": "a", "correct": True, "explanation": "a is right"},
            {"text": "b", "correct": True, "explanation": "b is right"},
            {"text": "c", "correct": False, "explanation": "c is wrong"}]},
        {"id": "t-num", "type": "numeric", "prompt": "How many bytes?", "answer": 8, "tolerance": 0.5,
         "unit": "bytes", "explanation": "two fp32 states", "hint": "count the states",
         "wrong_answers": [{"answer": 16, "explanation": "that adds weights and gradients"}]},
    ]}


def write(tmp_path: Path, data, name: str = "bad_bank.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def test_valid_bank_loads(tmp_path):
    bank = load_bank(write(tmp_path, valid_bank()))
    assert bank.name == "bad_bank" and bank.title == "Test bank" and len(bank) == 3
    single, multi, num = bank.questions
    assert single.right_choices == (0,) and multi.right_choices == (0, 1)
    assert (num.answer, num.tolerance, num.unit) == (8.0, 0.5, "bytes")


def _q(i):
    return lambda d: d["questions"][i]


# (test id, mutation, question named in the message (None: a bank-level problem), problem fragment)
CASES = [
    ("unknown-top-key", lambda d: d.update(extra=1), None, "unknown top-level key 'extra'"),
    ("no-title", lambda d: d.pop("title"), None, "'title' must be a non-empty string"),
    ("no-questions", lambda d: d.update(questions=[]), None, "'questions' must be a non-empty list"),
    ("question-not-mapping", lambda d: d["questions"].append("oops"), "#4 (no id)", "must be a mapping"),
    ("missing-id", lambda d: _q(0)(d).pop("id"), "#1 (no id)", "'id' is missing"),
    ("bad-id", lambda d: _q(0)(d).update(id="Bad Id"), "'Bad Id'", "must be lowercase"),
    ("duplicate-id", lambda d: _q(1)(d).update(id="t-single"), "'t-single'", "duplicate id"),
    ("bad-type", lambda d: _q(0)(d).update(type="essay"), "'t-single'", "'type' must be one of"),
    ("unknown-key", lambda d: _q(0)(d).update(explaination="typo"), "'t-single'", "unknown key 'explaination'"),
    ("numeric-key-on-choice-question", lambda d: _q(0)(d).update(tolerance=1), "'t-single'", "unknown key 'tolerance'"),
    ("no-prompt", lambda d: _q(0)(d).pop("prompt"), "'t-single'", "'prompt' must be a non-empty string"),
    ("one-choice", lambda d: _q(0)(d)["choices"].pop() and _q(0)(d)["choices"].pop(), "'t-single'",
     "at least two choices"),
    ("choice-not-mapping", lambda d: _q(0)(d)["choices"].append("d"), "'t-single'", "choice 4 must be a mapping"),
    ("choice-no-explanation", lambda d: _q(0)(d)["choices"][1].pop("explanation"), "'t-single'",
     "choice 2: 'explanation' must be a non-empty string"),
    ("choice-empty-explanation", lambda d: _q(1)(d)["choices"][2].update(explanation="  "), "'t-multi'",
     "choice 3: 'explanation' must be a non-empty string"),
    ("choice-unknown-key", lambda d: _q(0)(d)["choices"][0].update(why="x"), "'t-single'", "unknown key 'why'"),
    ("choice-text-number", lambda d: _q(0)(d)["choices"][0].update(text=8), "'t-single'", "quote it"),
    ("choice-correct-not-bool", lambda d: _q(0)(d)["choices"][0].update(correct="yes"), "'t-single'",
     "'correct' must be true or false"),
    ("duplicate-choice-text", lambda d: _q(0)(d)["choices"][2].update(text="wrong"), "'t-single'",
     "two choices have the same text 'wrong'"),
    ("single-two-right", lambda d: _q(0)(d)["choices"][1].update(correct=True), "'t-single'",
     "exactly one right answer, it has 2"),
    ("single-no-right", lambda d: _q(0)(d)["choices"][0].update(correct=False), "'t-single'",
     "exactly one right answer, it has 0"),
    ("multiple-no-right", lambda d: [c.update(correct=False) for c in _q(1)(d)["choices"]], "'t-multi'",
     "at least one right answer"),
    ("numeric-no-answer", lambda d: _q(2)(d).pop("answer"), "'t-num'", "'answer' must be a number"),
    ("numeric-answer-text", lambda d: _q(2)(d).update(answer="eight"), "'t-num'", "'answer' must be a number"),
    ("numeric-no-tolerance", lambda d: _q(2)(d).pop("tolerance"), "'t-num'", "needs a 'tolerance'"),
    ("numeric-negative-tolerance", lambda d: _q(2)(d).update(tolerance=-1), "'t-num'",
     "'tolerance' must be a number >= 0"),
    ("numeric-bad-percent", lambda d: _q(2)(d).update(tolerance="x%"), "'t-num'", "not a valid percentage"),
    ("numeric-no-explanation", lambda d: _q(2)(d).pop("explanation"), "'t-num'", "'explanation' must be"),
    ("numeric-choices", lambda d: _q(2)(d).update(choices=[]), "'t-num'", "unknown key 'choices'"),
    ("wrong-answer-malformed", lambda d: _q(2)(d).update(wrong_answers=[{"answer": 4}]), "'t-num'",
     "wrong answer 1 must have exactly 'answer' and 'explanation'"),
    ("wrong-answer-is-right", lambda d: _q(2)(d)["wrong_answers"].append({"answer": 8.2, "explanation": "x"}),
     "'t-num'", "wrong answer 2 (8.2) is within the tolerance"),
]


@pytest.mark.parametrize("mutate, where, problem", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validation_error_names_file_question_and_problem(tmp_path, mutate, where, problem):
    data = valid_bank()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(QuizError) as err:
        load_bank(path)
    lines = [line for line in err.value.problems if problem in line]
    assert lines, f"no problem mentioning {problem!r} in:\n{err.value}"
    assert all(line.startswith(str(path)) for line in err.value.problems)
    if where is not None:
        assert f"question {where}" in lines[0]


def test_not_a_mapping_and_bad_yaml_name_the_file(tmp_path):
    path = write(tmp_path, "- just\n- a list\n")
    with pytest.raises(QuizError, match=re.escape(str(path)) + ".*must be a mapping"):
        load_bank(path)
    path = write(tmp_path, "title: x\nquestions: [\n", name="broken.yaml")
    with pytest.raises(QuizError, match=re.escape(str(path)) + ": not valid YAML"):
        load_bank(path)


def test_every_problem_is_reported_at_once(tmp_path):
    data = valid_bank()
    data["questions"][0]["choices"][1]["correct"] = True
    data["questions"][2].pop("tolerance")
    with pytest.raises(QuizError) as err:
        load_bank(write(tmp_path, data))
    assert len(err.value.problems) == 2
    assert "'t-single'" in err.value.problems[0] and "'t-num'" in err.value.problems[1]


def test_ids_must_be_unique_across_banks(tmp_path, monkeypatch):
    write(tmp_path, valid_bank(), name="00_a.yaml")
    other = valid_bank()
    other["questions"][2]["id"] = "t-other"
    write(tmp_path, other, name="01_b.yaml")
    monkeypatch.setattr(quiz_bank, "quiz_dir", lambda: tmp_path)  # where all_banks looks
    with pytest.raises(QuizError) as err:
        all_banks()
    text = str(err.value)
    assert str(tmp_path / "01_b.yaml") in text and "'t-single'" in text and "00_a.yaml" in text
    assert "'t-other'" not in text


def test_percentage_tolerance(tmp_path):
    data = valid_bank()
    data["questions"][2].update(answer=200, tolerance="5%", wrong_answers=[])
    q = load_bank(write(tmp_path, data)).questions[2]
    assert q.tolerance == pytest.approx(10)
    assert grade(q, 209).correct and not grade(q, 211).correct


# --- grading -------------------------------------------------------------------------------------
@pytest.fixture
def qs(tmp_path):
    return load_bank(write(tmp_path, valid_bank())).questions


def test_grade_single(qs):
    single = qs[0]
    right = grade(single, 0)
    assert right.answered and right.correct and right.message.startswith("Correct")
    assert [f.text for f in right.feedback] == ["right", "wrong", "also wrong"]  # why each one is right or wrong
    assert right.feedback[0].correct and right.feedback[0].explanation == "right because"
    wrong = grade(single, 2)
    assert wrong.answered and not wrong.correct and "Not quite" in wrong.message
    # only the pick is explained: the right answer stays hidden
    assert len(wrong.feedback) == 1 and wrong.feedback[0].explanation == "also wrong because"
    none = grade(single, None)
    assert not none.answered and not none.correct and "Pick an answer" in none.message
    for bad in (3, -1, True, "0"):
        with pytest.raises(ValueError):
            grade(single, bad)


def test_grade_multiple(qs):
    multi = qs[1]
    right = grade(multi, [1, 0])
    assert right.correct and len(right.feedback) == 3
    missing = grade(multi, [0])
    assert missing.answered and not missing.correct and "missing" in missing.message
    assert [f.text for f in missing.feedback] == ["a"] and missing.feedback[0].correct
    extra = grade(multi, (0, 1, 2))
    assert not extra.correct and "1 of your picks is wrong" in extra.message and "missing" not in extra.message
    assert {f.text: f.correct for f in extra.feedback} == {"a": True, "b": True, "c": False}
    both = grade(multi, {0, 2})
    assert "is wrong" in both.message and "missing" in both.message
    assert not grade(multi, []).answered and not grade(multi, None).answered
    assert not grade(multi, 0).correct  # one index is accepted as a one-element pick
    with pytest.raises(ValueError):
        grade(multi, "ab")
    with pytest.raises(ValueError):
        grade(multi, [5])


def test_grade_numeric(qs):
    num = qs[2]
    for ok in (8, 8.0, "8", " 8.4 ", 7.5, "7.5"):
        v = grade(num, ok)
        assert v.correct, ok
        assert v.feedback[0].explanation == "two fp32 states"
    v = grade(num, 16)
    assert v.answered and not v.correct and v.feedback[0].explanation == "that adds weights and gradients"
    assert v.feedback[0].text == "16 bytes"
    v = grade(num, "16.3")  # a common wrong answer is matched within the tolerance
    assert v.feedback[0].explanation == "that adds weights and gradients"
    v = grade(num, 9)
    assert not v.correct and v.feedback[0].explanation == "count the states"  # the hint
    for nothing in (None, "", "eight", float("nan"), True):
        v = grade(num, nothing)
        assert not v.answered and not v.correct and "Type a number" in v.message


def test_parse_number_reads_what_people_type():
    assert Q.parse_number("1,050") == 1050 and Q.parse_number("4.1e3") == 4100 and Q.parse_number("1_000") == 1000
    assert Q.parse_number("inf") is None and Q.parse_number(False) is None


def test_grade_every_shipped_question_right_and_wrong():
    for bank in all_banks():
        for q in bank.questions:
            if q.type == "numeric":
                assert grade(q, q.answer).correct, q.id
                assert not grade(q, q.answer + 2 * q.tolerance + 1).correct, q.id
            else:
                assert grade(q, list(q.right_choices) if q.type == "multiple" else q.right_choices[0]).correct
                wrong = next(i for i, c in enumerate(q.choices) if not c.correct)
                assert not grade(q, [wrong] if q.type == "multiple" else wrong).correct, q.id


# --- the widget, driven in Python ----------------------------------------------------------------
def test_show_quiz_outside_a_notebook_prints_the_text_and_returns_the_widget(capsys):
    import ipywidgets

    quiz = show_quiz("01_gradient_checkpointing")
    assert isinstance(quiz, Q.Quiz) and isinstance(quiz, ipywidgets.VBox)
    out = capsys.readouterr().out
    assert out.strip() == quiz.text().strip()
    assert quiz.score == (0, len(load_bank("01")))


def test_single_choice_wrong_then_right(capsys):
    quiz = show_quiz("01_gradient_checkpointing")
    qw = quiz.questions[0]
    q = qw.question
    wrong = wrong_choice(q)
    right = q.right_choices[0]
    assert qw.again_button.layout.display == "none"

    text = check(qw, wrong)
    assert qw.controls.value == wrong
    assert "Not quite" in text and Q._plain(q.choices[wrong].explanation)[:60] in text
    assert Q._plain(q.choices[right].explanation)[:60] not in text  # the right answer is not given away
    assert quiz.score[0] == 0 and "Score: 0/" in quiz.score_label.value
    assert not qw.check_button.disabled and qw.again_button.layout.display is None

    text = check(qw, right)
    assert "Correct" in text and Q._plain(q.choices[right].explanation)[:60] in text
    assert Q._plain(q.choices[wrong].explanation)[:60] in text  # now every choice's explanation is shown
    assert quiz.score == (1, len(quiz.questions)) and f"Score: 1/{len(quiz.questions)}" in quiz.score_label.value
    assert qw.controls.disabled and qw.check_button.disabled  # locked until Try again
    # ... and it reads as right, not as a disabled control's pale grey: the controls and Check are hidden,
    # and the locked view shows every choice, the right one alone in bold green with a check mark
    assert qw.locked and qw.answer_box.layout.display == "none" and qw.check_button.layout.display == "none"
    assert qw.locked_view.layout.display is None and "course-quiz-locked" in qw.locked_view._dom_classes
    [(style, mark)] = picked(qw.locked_view.value)
    assert style == "color:#1a7f37;font-weight:bold" and mark == f"\u25c9 {Q._plain(q.choices[right].text)} \u2714"
    for j in qw.order:
        assert Q._html(q.choices[j].text) in qw.locked_view.value


def test_try_again_resets_the_question_and_the_score():
    quiz = Q.make_quiz("01_gradient_checkpointing")
    qw = quiz.questions[0]
    qw.select(qw.question.right_choices[0])
    qw.check_button.click()
    assert quiz.score[0] == 1
    qw.again_button.click()
    assert qw.controls.value is None and qw.feedback.value == "" and qw.verdict is None
    assert not qw.controls.disabled and not qw.check_button.disabled
    assert qw.again_button.layout.display == "none"
    assert not qw.locked and qw.locked_view.value == "" and qw.locked_view.layout.display == "none"
    assert qw.answer_box.layout.display is None and qw.check_button.layout.display is None  # the controls are back
    assert quiz.score[0] == 0 and "Score: 0/" in quiz.score_label.value


def test_check_without_an_answer_asks_for_one():
    quiz = Q.make_quiz("01")
    qw = quiz.questions[0]
    qw.check_button.click()
    assert "Pick an answer first" in qw.feedback_text and qw.verdict is None and quiz.score[0] == 0
    assert "0 of" in quiz.score_label.value


def test_multiple_choice_and_numeric_widgets():
    quiz = Q.make_quiz("01_gradient_checkpointing")
    multi = first(quiz, "multiple")
    right = list(multi.question.right_choices)
    assert "missing" in check(multi, right[:1]) and not multi.correct
    assert multi.answer == right[:1]
    check(multi, right)
    # the checkboxes shown on screen hold the picks (in display order)
    ticked = [j for j, box in zip(multi.order, multi.controls) if box.value]
    assert sorted(ticked) == right
    assert multi.correct

    num = first(quiz, "numeric")
    assert "divides the saving by the new peak" in check(num, "36")  # typed in the box
    assert not num.correct and num.controls.value == "36"
    check(num, str(num.question.answer))
    assert num.correct and quiz.score == (2, len(quiz.questions))
    assert "2 of" in quiz.score_label.value

    quiz.reset_button.click()  # Start over
    assert quiz.score == (0, len(quiz.questions))
    assert all(w.verdict is None and w.feedback.value == "" for w in quiz.questions)
    assert num.controls.value == "" and not any(b.value for b in multi.controls)


def test_learner_session_quiz_and_checklist():
    """What tests/test_quiz_ipywidgets7.py checks under ipywidgets 7.7, here under the installed 8.x."""
    import ipywidgets

    seen = learner_session()
    assert seen["ipywidgets"] == ipywidgets.__version__
    check_session(seen)


def test_widget_labels_follow_the_display_order():
    qw = Q.make_quiz("00").questions[0]
    labels = [label for label, _ in qw.controls.options]
    assert labels == [Q._plain(qw.question.choices[j].text) for j in qw.order]
    assert [v for _, v in qw.controls.options] == qw.order


# --- the text fallback ---------------------------------------------------------------------------
def _explanations(q):
    texts = [c.explanation for c in q.choices] + [q.explanation, q.hint] + [w.explanation for w in q.wrong_answers]
    return [t for t in texts if t]


@pytest.mark.parametrize("name", NOTEBOOK_BANKS)
def test_text_fallback_shows_questions_without_answers(name):
    quiz = Q.make_quiz(name)
    bundle = quiz._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == quiz.text() == repr(quiz)
    assert bundle["text/markdown"] == quiz.markdown()
    one_line = lambda text: " ".join(text.split())  # noqa: E731  (the text copy is wrapped at 100 characters)
    for rendering in (quiz.text(), quiz.markdown()):
        flat = one_line(rendering.replace("\\", ""))
        for q in quiz.question_list:
            assert one_line(q.prompt) in flat, q.id
            for c in q.choices:
                assert one_line(c.text) in flat, (q.id, c.text)
            for explanation in _explanations(q):
                assert one_line(explanation) not in flat, (q.id, explanation)
        assert not re.search(r"\b(correct|right answer)\s*:", flat, re.I)
    # nothing marks the right choice: every choice line looks the same
    marks = set(re.findall(r"^\s+(\(.\)|\[.\])", quiz.text(), re.M))
    assert marks <= {"( )", "[ ]"}


def test_markdown_escapes_formatting_outside_code():
    assert Q._md("a_b *c* ~30% <x> `keep_this*`") == r"a\_b \*c\* \~30% \<x\> `keep_this*`"


def test_chapter_quiz_draws_from_every_bank():
    n = len(CHAPTER_BANKS)  # notebook 10 asks one question of each bank (show_chapter_quiz(n=11))
    qs = Q.chapter_questions(n, seed=0)
    assert len(qs) == n and len({q.id for q in qs}) == n
    assert {q.bank for q in qs} == set(CHAPTER_BANKS)  # 11 questions, 11 banks: every bank is asked
    assert [q.id for q in Q.chapter_questions(n, seed=0)] == [q.id for q in qs]  # same seed, same quiz
    assert [q.id for q in Q.chapter_questions(n, seed=1)] != [q.id for q in qs]
    assert [q.bank for q in qs] == sorted(q.bank for q in qs)  # in notebook order
    total = sum(len(b) for b in quiz_bank.chapter_banks())
    assert len(Q.chapter_questions(total)) == total
    for bad in (0, total + 1):
        with pytest.raises(ValueError):
            Q.chapter_questions(bad)
    quiz = Q.show_chapter_quiz(n=5, seed=3)
    assert len(quiz.questions) == 5 and "Chapter 3" in quiz.text()


def test_in_ipython_show_quiz_displays_once_with_text_fallbacks(ipython_shell):
    from IPython.utils.capture import capture_output

    shell = ipython_shell
    with capture_output() as cap:
        shell.run_cell("from course_utils.chapter.quiz.widget import show_quiz\nshow_quiz('01_gradient_checkpointing')",
                       store_history=True)
    assert len(cap.outputs) == 1
    assert "Quiz:" not in cap.stdout, "the quiz is displayed once, not again as the cell's result"
    data = cap.outputs[0].data
    assert {"text/plain", "text/markdown", "application/vnd.jupyter.widget-view+json"} <= set(data)
    assert data["text/plain"].startswith("Quiz: Gradient checkpointing")
    with capture_output() as cap:  # a returned quiz shown again in a later cell displays
        shell.run_cell("q = show_quiz('00')", store_history=True)
        shell.run_cell("q", store_history=True)
    assert len(cap.outputs) == 2


# --- packaging -----------------------------------------------------------------------------------
def test_banks_ship_inside_the_package(tmp_path):
    """pyproject maps quizzes/ to course_utils/quizzes/; an installed copy finds the banks there."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "course_utils.quizzes" in config["packages"]
    assert config["package-dir"]["course_utils.quizzes"] == "quizzes"
    patterns = config["package-data"]["course_utils.quizzes"]
    # lay out what setuptools puts in a wheel, from the same patterns
    site = tmp_path / "site"
    shutil.copytree(ROOT / "course_utils", site / "course_utils", ignore=shutil.ignore_patterns("__pycache__"))
    shipped = site / "course_utils" / "quizzes"
    shipped.mkdir()
    for pattern in patterns:
        for f in (ROOT / "quizzes").glob(pattern):
            shutil.copy(f, shipped / f.name)
    assert {p.name for p in (ROOT / "quizzes").glob("*.yaml")} <= {p.name for p in shipped.iterdir()}
    code = ("import course_utils.chapter.quiz.bank as q; print(q.quiz_dir()); "
            "print(sum(len(b) for b in q.all_banks()))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert Path(out[0]) == shipped
    assert int(out[1]) == sum(len(b) for b in all_banks())
