"""Generate the small instruction data set shipped with course_utils.

The output, ``course_utils/data/instructions.jsonl``, has exactly the schema
of databricks-dolly-15k (``instruction``, ``context``, ``response``,
``category``) but none of its text: every record is built here from small
fixed tables and templates, so a tiny language model can visibly learn the
tasks in a few dozen training steps.

The script is deterministic (fixed seed, standard library only, no network):
running it twice writes byte-identical files.

Usage::

    python scripts/data/make_instructions.py            # (re)write the shipped file
    python scripts/data/make_instructions.py --check    # exit 1 if it is out of date
    python scripts/data/make_instructions.py --output /tmp/x.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

SEED = 15_000
DEFAULT_OUTPUT = (
    Path(__file__).resolve().parents[2] / "course_utils" / "data" / "instructions.jsonl"
)

Record = dict[str, str]
Maker = Callable[[random.Random], Record]

# ---------------------------------------------------------------------------
# Fixed tables (plain facts and word lists)
# ---------------------------------------------------------------------------

# fmt: off
CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Peru", "Lima"), ("Kenya", "Nairobi"),
    ("Norway", "Oslo"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Austria", "Vienna"),
    ("Greece", "Athens"), ("Canada", "Ottawa"), ("Australia", "Canberra"), ("China", "Beijing"),
    ("India", "New Delhi"), ("Russia", "Moscow"), ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"), ("Poland", "Warsaw"), ("Chile", "Santiago"),
    ("Argentina", "Buenos Aires"), ("Cuba", "Havana"), ("Vietnam", "Hanoi"),
    ("Thailand", "Bangkok"), ("South Korea", "Seoul"), ("Turkey", "Ankara"),
    ("Denmark", "Copenhagen"), ("Hungary", "Budapest"), ("Nigeria", "Abuja"),
    ("Ghana", "Accra"), ("Morocco", "Rabat"), ("Belgium", "Brussels"),
]

COLOURS = [
    ("banana", "yellow"), ("lemon", "yellow"), ("lime", "green"), ("cherry", "red"),
    ("strawberry", "red"), ("raspberry", "red"), ("blueberry", "blue"),
    ("blackberry", "black"), ("orange", "orange"), ("tomato", "red"),
    ("pumpkin", "orange"), ("cucumber", "green"), ("carrot", "orange"),
    ("eggplant", "purple"),
]

OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"),
    ("happy", "sad"), ("open", "closed"), ("early", "late"), ("full", "empty"),
    ("hard", "soft"), ("high", "low"), ("wet", "dry"), ("strong", "weak"),
    ("rich", "poor"), ("loud", "quiet"), ("thick", "thin"), ("heavy", "light"),
    ("day", "night"), ("win", "lose"), ("push", "pull"), ("inside", "outside"),
    ("first", "last"), ("clean", "dirty"), ("true", "false"), ("above", "below"),
    ("buy", "sell"), ("north", "south"), ("east", "west"), ("cold", "hot"),
]

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July",
    "August", "September", "October", "November", "December",
]

# One noun per first letter, so sorted order is easy to see.
WORDS = [
    "apple", "bread", "chair", "dog", "egg", "fish", "grape", "house", "ink",
    "jam", "kite", "lamp", "moon", "nest", "owl", "pen", "queen", "rose",
    "sun", "tree", "umbrella", "vase", "wolf", "box", "yarn", "zebra",
]
ADJECTIVES = ["red", "big", "old", "small", "green", "quiet", "happy", "cold", "blue", "soft"]

FIRST_NAMES = [
    "Mara", "Tomas", "Lena", "Omar", "Priya", "Jonas", "Aiko", "Felix", "Nora",
    "Ravi", "Elena", "Kofi", "Sofia", "Hugo", "Ines", "Yuki", "Bruno", "Clara",
    "Diego", "Freya", "Ivan", "Leila", "Marco", "Nadia", "Oskar", "Rosa",
    "Samir", "Talia", "Viktor", "Zara",
]
SURNAMES = [
    "Santos", "Berg", "Okafor", "Novak", "Tanaka", "Weber", "Rossi", "Khan",
    "Larsen", "Moreau", "Silva", "Costa", "Meyer", "Ito", "Hale", "Reyes",
]
CITIES = [
    "Oslo", "Lisbon", "Cairo", "Lima", "Tokyo", "Nairobi", "Dublin", "Madrid",
    "Vienna", "Seoul", "Hanoi", "Athens", "Toronto", "Sydney", "Berlin", "Rome",
]
JOBS = [
    "baker", "teacher", "nurse", "pilot", "farmer", "painter", "doctor", "chef",
    "driver", "gardener", "writer", "dancer", "tailor", "fisher", "librarian",
]
PETS = ["cat", "dog", "parrot", "rabbit", "turtle", "goldfish", "hamster", "horse"]

ANIMALS = [
    "dog", "cat", "horse", "cow", "lion", "tiger", "sheep", "rabbit", "elephant",
    "owl", "eagle", "frog", "bear", "goat", "fox",
]
VEHICLES = [
    "car", "bus", "train", "bicycle", "truck", "boat", "airplane", "tram",
    "motorbike", "scooter", "ship", "taxi", "van", "tractor", "helicopter",
]

PRODUCTS = [
    "lamp", "backpack", "kettle", "chair", "jacket", "blender", "umbrella",
    "notebook", "clock", "mug", "tent", "bicycle", "pillow", "toaster", "desk",
]
GOOD_WORDS = ["great", "excellent", "wonderful", "lovely", "fantastic", "perfect"]
BAD_WORDS = ["terrible", "awful", "broken", "disappointing", "flimsy", "useless"]
GOOD_ENDINGS = ["I would buy it again.", "I love it.", "I recommend it to everyone."]
BAD_ENDINGS = ["I want my money back.", "I regret buying it.", "I would not recommend it."]

BRAINSTORM_LISTS = {
    "fruits": ["apple", "pear", "plum", "banana", "cherry", "mango", "peach", "grape", "lemon"],
    "colours": ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink"],
    "animals": ["dog", "cat", "horse", "lion", "rabbit", "fox", "bear", "goat", "owl"],
    "vehicles": ["car", "bus", "train", "bicycle", "truck", "boat", "tram", "van", "ship"],
    "sports": ["football", "tennis", "swimming", "running", "cycling", "golf", "rugby",
               "skiing"],
    "musical instruments": ["piano", "guitar", "violin", "drum", "flute", "trumpet", "cello",
                            "harp"],
    "kitchen tools": ["knife", "spoon", "fork", "pan", "pot", "whisk", "ladle", "grater"],
    "vegetables": ["carrot", "potato", "onion", "pea", "bean", "leek", "cabbage", "spinach"],
    "drinks": ["water", "tea", "coffee", "milk", "juice", "lemonade", "cocoa", "cider"],
    "flowers": ["rose", "tulip", "daisy", "lily", "orchid", "sunflower", "poppy", "iris"],
    "birds": ["owl", "eagle", "robin", "sparrow", "crow", "swan", "duck", "parrot"],
    "jobs": ["baker", "teacher", "nurse", "pilot", "farmer", "doctor", "chef", "tailor"],
    "trees": ["oak", "pine", "birch", "maple", "willow", "elm", "ash", "cedar"],
    "shapes": ["circle", "square", "triangle", "oval", "star", "heart", "diamond", "hexagon"],
}

# noun -> (first adjective, second adjective, where it is seen)
POEM_NOUNS = {
    "sun": ("bright", "warm", "in the sky"), "moon": ("pale", "quiet", "at night"),
    "sea": ("deep", "blue", "from the shore"), "river": ("long", "cold", "in the valley"),
    "forest": ("green", "dark", "on the hill"), "rain": ("soft", "grey", "on the roof"),
    "snow": ("white", "cold", "in winter"), "wind": ("fast", "wild", "in the trees"),
    "mountain": ("tall", "old", "far away"), "garden": ("green", "bright", "in spring"),
    "city": ("busy", "loud", "at dusk"), "cat": ("small", "soft", "by the fire"),
    "star": ("tiny", "bright", "at night"), "bird": ("small", "quick", "in the morning"),
    "road": ("long", "dusty", "in summer"), "lake": ("calm", "clear", "at dawn"),
    "tree": ("tall", "green", "in the park"), "storm": ("dark", "loud", "over the sea"),
    "flower": ("red", "sweet", "in the field"), "train": ("long", "fast", "at the station"),
    "book": ("old", "heavy", "on the shelf"), "bread": ("warm", "fresh", "in the bakery"),
    "candle": ("small", "bright", "in the dark"), "clock": ("old", "slow", "on the wall"),
    "island": ("small", "green", "in the sea"), "bridge": ("long", "strong", "over the river"),
    "desert": ("hot", "dry", "at noon"), "cloud": ("white", "soft", "in the sky"),
    "horse": ("strong", "fast", "in the field"), "winter": ("cold", "quiet", "outside"),
}

SHOPS = {
    "bakery": ["bread", "cakes", "rolls", "pies", "biscuits"],
    "bookshop": ["novels", "maps", "comics", "cookbooks", "atlases"],
    "flower shop": ["roses", "tulips", "lilies", "daisies", "orchids"],
    "toy shop": ["kites", "puzzles", "dolls", "trains", "balls"],
    "fruit stall": ["apples", "pears", "plums", "cherries", "grapes"],
}
HOBBIES = ["chess", "hiking", "painting", "cycling", "singing", "reading", "running", "cooking"]
STRUCTURES = ["bridge", "library", "museum", "theatre", "school", "market", "tower", "hospital"]
TRAVEL = ["train", "bus", "car", "boat", "bicycle"]
# fmt: on


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------


def record(category: str, instruction: str, response: str, context: str = "") -> Record:
    """Build one record with dolly's four fields."""
    return {
        "instruction": instruction,
        "context": context,
        "response": response,
        "category": category,
    }


def article(word: str) -> str:
    """Return 'a' or 'an' for a word (our word lists have no tricky cases)."""
    return "an" if word[0].lower() in "aeiou" else "a"


def join_and(items: list[str]) -> str:
    """Join items as 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def number_word(k: int) -> str:
    """Spell out a small number."""
    return ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight"][k]


def full_name(rng: random.Random) -> str:
    """Pick a random first name and surname."""
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"


# ---------------------------------------------------------------------------
# open_qa: facts from fixed tables
# ---------------------------------------------------------------------------


def capital(rng: random.Random) -> Record:
    """What is the capital of a country (or whose capital is a city)?"""
    country, city = rng.choice(CAPITALS)
    template = rng.randrange(3)
    if template == 0:
        return record(
            "open_qa", f"What is the capital of {country}?", f"The capital of {country} is {city}."
        )
    if template == 1:
        return record(
            "open_qa",
            f"Which city is the capital of {country}?",
            f"The capital of {country} is {city}.",
        )
    return record(
        "open_qa",
        f"{city} is the capital of which country?",
        f"{city} is the capital of {country}.",
    )


def colour(rng: random.Random) -> Record:
    """What colour is a fruit or vegetable?"""
    thing, col = rng.choice(COLOURS)
    a = article(thing).capitalize()
    if rng.randrange(2) == 0:
        question = f"What colour is {article(thing)} {thing}?"
    else:
        question = f"Which colour does {article(thing)} {thing} usually have?"
    return record("open_qa", question, f"{a} {thing} is usually {col}.")


def opposite(rng: random.Random) -> Record:
    """What is the opposite of a word?"""
    word, opp = rng.choice(OPPOSITES)
    if rng.randrange(2) == 0:
        question = f"What is the opposite of {word}?"
    else:
        question = f"Give the opposite of the word {word}."
    return record("open_qa", question, f"The opposite of {word} is {opp}.")


# ---------------------------------------------------------------------------
# general_qa: arithmetic, calendar facts and simple word games
# ---------------------------------------------------------------------------


def plus(rng: random.Random) -> Record:
    """Add two numbers."""
    a, b = rng.randint(1, 60), rng.randint(1, 60)
    return record("general_qa", f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.")


def minus(rng: random.Random) -> Record:
    """Subtract a smaller number from a larger one."""
    a = rng.randint(5, 99)
    b = rng.randint(1, a)
    return record("general_qa", f"What is {a} minus {b}?", f"{a} minus {b} is {a - b}.")


def times(rng: random.Random) -> Record:
    """Multiply two small numbers."""
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return record("general_qa", f"What is {a} times {b}?", f"{a} times {b} is {a * b}.")


def calendar(rng: random.Random) -> Record:
    """Which day or month comes after / before another?"""
    kind, names = rng.choice([("day", DAYS), ("month", MONTHS)])
    i = rng.randrange(len(names))
    if rng.randrange(2) == 0:
        nxt = names[(i + 1) % len(names)]
        return record(
            "general_qa",
            f"What {kind} comes after {names[i]}?",
            f"The {kind} after {names[i]} is {nxt}.",
        )
    prev = names[i - 1]
    return record(
        "general_qa",
        f"What {kind} comes before {names[i]}?",
        f"The {kind} before {names[i]} is {prev}.",
    )


def count_words(rng: random.Random) -> Record:
    """Count the words in a phrase."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(2, 8))]
    return record(
        "general_qa",
        f"How many words are in this phrase: {' '.join(words)}",
        f"There are {len(words)} words.",
    )


def reverse_list(rng: random.Random) -> Record:
    """Reverse a short list of words."""
    words = rng.sample(WORDS, rng.randint(3, 5))
    return record(
        "general_qa",
        f"Reverse the order of these words: {', '.join(words)}",
        ", ".join(reversed(words)),
    )


def sort_list(rng: random.Random) -> Record:
    """Sort a short list of words alphabetically."""
    words = rng.sample(WORDS, rng.randint(3, 5))
    return record(
        "general_qa",
        f"Sort these words in alphabetical order: {', '.join(words)}",
        ", ".join(sorted(words)),
    )


def phrase(rng: random.Random) -> str:
    """A short phrase such as 'the old kite and the red moon'."""
    first = f"the {rng.choice(ADJECTIVES)} {rng.choice(WORDS)}"
    if rng.randrange(2) == 0:
        return first
    return f"{first} and the {rng.choice(ADJECTIVES)} {rng.choice(WORDS)}"


def capitalize_phrase(rng: random.Random) -> Record:
    """Write a phrase in capital letters."""
    text = phrase(rng)
    return record("general_qa", f"Write this phrase in capital letters: {text}", text.upper())


def copy_phrase(rng: random.Random) -> Record:
    """Repeat a phrase exactly."""
    text = phrase(rng)
    return record("general_qa", f"Repeat this phrase exactly: {text}", text)


# ---------------------------------------------------------------------------
# closed_qa: answer from a short context about people
# ---------------------------------------------------------------------------


def person_facts(rng: random.Random, name: str) -> tuple[dict[str, str], str]:
    """Random facts about one person and the two sentences that state them."""
    facts = {"city": rng.choice(CITIES), "job": rng.choice(JOBS), "pet": rng.choice(PETS)}
    job = f"{article(facts['job'])} {facts['job']}"
    text = f"{name} lives in {facts['city']} and works as {job}. {name} has a pet {facts['pet']}."
    return facts, text


def question_about(rng: random.Random, name: str, facts: dict[str, str]) -> tuple[str, str]:
    """A question about one person and its answer."""
    kind = rng.randrange(4)
    if kind == 0:
        return f"Where does {name} live?", f"{name} lives in {facts['city']}."
    if kind == 1:
        return f"What is {name}'s job?", f"{name} works as {article(facts['job'])} {facts['job']}."
    if kind == 2:
        return f"What pet does {name} have?", f"{name} has a pet {facts['pet']}."
    other = rng.choice(CITIES)
    if other == facts["city"]:
        return f"Does {name} live in {other}?", f"Yes, {name} lives in {other}."
    return f"Does {name} live in {other}?", f"No, {name} lives in {facts['city']}."


def closed_short(rng: random.Random) -> Record:
    """A question about one person described in the context."""
    name = rng.choice(FIRST_NAMES)
    facts, context = person_facts(rng, name)
    question, answer = question_about(rng, name, facts)
    return record("closed_qa", question, answer, context)


def closed_long(rng: random.Random) -> Record:
    """A question about one of several people described in the context."""
    names = rng.sample(FIRST_NAMES, rng.randint(5, 8))
    people = [person_facts(rng, name) for name in names]
    context = " ".join(text for _, text in people)
    i = rng.randrange(len(names))
    question, answer = question_about(rng, names[i], people[i][0])
    return record("closed_qa", question, answer, context)


# ---------------------------------------------------------------------------
# information_extraction: pull a year, a name or a city out of the context
# ---------------------------------------------------------------------------


def event_sentence(rng: random.Random) -> tuple[dict[str, str], str]:
    """One sentence about who built what, where and when."""
    facts = {
        "name": full_name(rng),
        "city": rng.choice(CITIES),
        "year": str(rng.randint(1800, 2020)),
        "thing": rng.choice(STRUCTURES),
    }
    template = rng.randrange(3)
    name, city, year, thing = facts["name"], facts["city"], facts["year"], facts["thing"]
    if template == 0:
        text = f"{name} built the {thing} in {city} in {year}."
    elif template == 1:
        text = f"In {year}, {name} completed the {thing} in {city}."
    else:
        text = f"The {thing} in {city} was designed by {name} in {year}."
    return facts, text


def extract_one(rng: random.Random) -> Record:
    """Extract the year, the name or the city from one sentence."""
    facts, context = event_sentence(rng)
    kind = rng.randrange(3)
    if kind == 0:
        return record(
            "information_extraction", "Extract the year from the text.", facts["year"], context
        )
    if kind == 1:
        return record(
            "information_extraction",
            "Extract the full name of the person in the text.",
            facts["name"],
            context,
        )
    return record(
        "information_extraction", "Which city is mentioned in the text?", facts["city"], context
    )


def extract_many(rng: random.Random) -> Record:
    """List all years or all names from a few sentences, in order."""
    events = [event_sentence(rng) for _ in range(rng.randint(3, 5))]
    context = " ".join(text for _, text in events)
    if rng.randrange(2) == 0:
        years = ", ".join(facts["year"] for facts, _ in events)
        return record(
            "information_extraction",
            "List every year mentioned in the text, in order.",
            years,
            context,
        )
    names = ", ".join(facts["name"] for facts, _ in events)
    return record(
        "information_extraction",
        "List every person mentioned in the text, in order.",
        names,
        context,
    )


# ---------------------------------------------------------------------------
# summarization: the first sentence plus the key detail
# ---------------------------------------------------------------------------

SUMMARY_INSTRUCTIONS = [
    "Summarize this paragraph in one sentence.",
    "Give a one-sentence summary of the text.",
]


def shop_story(rng: random.Random, name: str) -> tuple[str, str]:
    """A three-sentence paragraph about a shop and its one-sentence summary."""
    shop, goods = rng.choice(list(SHOPS.items()))
    city, items = rng.choice(CITIES), rng.sample(goods, 3)
    paragraph = (
        f"{name} runs a small {shop} in {city}. The {shop} sells {join_and(items)}. "
        f"It is open every day except {rng.choice(DAYS)}."
    )
    return paragraph, f"{name} runs a {shop} in {city} that sells {join_and(items)}."


def trip_story(rng: random.Random, name: str) -> tuple[str, str]:
    """A three-sentence paragraph about a trip and its one-sentence summary."""
    start, end = rng.sample(CITIES, 2)
    how, hours = rng.choice(TRAVEL), rng.randint(2, 12)
    paragraph = (
        f"{name} travelled from {start} to {end} by {how}. The trip took {hours} hours. "
        f"{name} arrived in the {rng.choice(['morning', 'afternoon', 'evening'])}."
    )
    return paragraph, f"{name} travelled from {start} to {end} by {how} in {hours} hours."


def club_story(rng: random.Random, name: str) -> tuple[str, str]:
    """A three-sentence paragraph about a club and its one-sentence summary."""
    city, hobby, day = rng.choice(CITIES), rng.choice(HOBBIES), rng.choice(DAYS)
    members = rng.randint(8, 90)
    paragraph = (
        f"The {city} {hobby} club meets every {day}. "
        f"It has {members} members and is led by {name}. "
        "New members are always welcome."
    )
    return (
        paragraph,
        f"The {city} {hobby} club, led by {name}, has {members} members and meets every {day}.",
    )


STORIES = [shop_story, trip_story, club_story]


def summarize_short(rng: random.Random) -> Record:
    """Summarize a three-sentence paragraph in one sentence."""
    story = rng.choice(STORIES)
    paragraph, summary = story(rng, rng.choice(FIRST_NAMES))
    return record("summarization", rng.choice(SUMMARY_INSTRUCTIONS), summary, paragraph)


def summarize_long(rng: random.Random) -> Record:
    """Summarize a nine-sentence text in three sentences."""
    name = rng.choice(FIRST_NAMES)
    parts = [story(rng, name) for story in STORIES]
    paragraph = " ".join(p for p, _ in parts)
    summary = " ".join(s for _, s in parts)
    return record("summarization", "Summarize this text in three sentences.", summary, paragraph)


# ---------------------------------------------------------------------------
# classification: sentiment, animal or vehicle, even or odd
# ---------------------------------------------------------------------------


def sentiment(rng: random.Random) -> Record:
    """Is a short product review positive or negative?"""
    product = rng.choice(PRODUCTS)
    positive = rng.randrange(2) == 0
    words, endings = (GOOD_WORDS, GOOD_ENDINGS) if positive else (BAD_WORDS, BAD_ENDINGS)
    review = f"The {product} is {rng.choice(words)}. {rng.choice(endings)}"
    label = "positive" if positive else "negative"
    question = rng.choice(
        ["Is this review positive or negative?", "Classify the sentiment of this review."]
    )
    return record("classification", question, f"The review is {label}.", review)


def animal_or_vehicle(rng: random.Random) -> Record:
    """Is one thing an animal or a vehicle?"""
    thing = rng.choice(ANIMALS + VEHICLES)
    kind = "animal" if thing in ANIMALS else "vehicle"
    question = f"Is {article(thing)} {thing} an animal or a vehicle?"
    return record(
        "classification",
        question,
        f"{article(thing).capitalize()} {thing} is {article(kind)} {kind}.",
    )


def animal_or_vehicle_list(rng: random.Random) -> Record:
    """Label each thing in a list as animal or vehicle."""
    things = rng.sample(ANIMALS + VEHICLES, rng.randint(3, 5))
    lines = [f"{t}: {'animal' if t in ANIMALS else 'vehicle'}" for t in things]
    question = f"Classify each of these as an animal or a vehicle: {', '.join(things)}"
    return record("classification", question, "\n".join(lines))


def even_or_odd(rng: random.Random) -> Record:
    """Is a number even or odd?"""
    n = rng.randint(1, 199)
    kind = "even" if n % 2 == 0 else "odd"
    return record(
        "classification", f"Is {n} an even or an odd number?", f"{n} is an {kind} number."
    )


# ---------------------------------------------------------------------------
# brainstorming: list a few items from a fixed list
# ---------------------------------------------------------------------------


def brainstorm(rng: random.Random) -> Record:
    """List a few items of a kind, picked from a fixed list."""
    topic, items = rng.choice(list(BRAINSTORM_LISTS.items()))
    k = rng.randint(2, 6)
    picked = rng.sample(items, k)
    template = rng.randrange(3)
    if template == 0:
        return record(
            "brainstorming", f"List {number_word(k)} {topic}.", "\n".join(f"- {p}" for p in picked)
        )
    if template == 1:
        return record(
            "brainstorming",
            f"Name {number_word(k)} {topic}.",
            f"Here are {number_word(k)} {topic}: {join_and(picked)}.",
        )
    return record(
        "brainstorming",
        f"Give me {number_word(k)} examples of {topic}.",
        f"{join_and(picked).capitalize()}.",
    )


# ---------------------------------------------------------------------------
# creative_writing: templated poems and descriptions
# ---------------------------------------------------------------------------


def creative(rng: random.Random) -> Record:
    """A templated poem, sentence or title about a noun."""
    noun = rng.choice(list(POEM_NOUNS))
    first, second, where = POEM_NOUNS[noun]
    template = rng.randrange(5)
    if template == 0:
        return record(
            "creative_writing",
            f"Write a two-line poem about the {noun}.",
            f"The {noun} is {first} and {second},\nI love to see it {where}.",
        )
    if template == 1:
        return record(
            "creative_writing",
            f"Write a short poem about the {noun}.",
            f"The {noun} is {first},\nthe {noun} is {second},\n"
            f"I see it {where},\nand it makes me glad.",
        )
    if template == 2:
        return record(
            "creative_writing",
            f"Write one sentence that describes the {noun}.",
            f"The {noun} is {first} and {second}.",
        )
    if template == 3:
        return record(
            "creative_writing",
            f"Write a title for a story about the {noun}.",
            f"The {first.capitalize()} {noun.capitalize()}",
        )
    return record(
        "creative_writing",
        f"Write a two-line poem about the {noun} {where}.",
        f"{where.capitalize()} the {noun} is {first},\n{where} the {noun} is {second}.",
    )


# ---------------------------------------------------------------------------
# Putting it together
# ---------------------------------------------------------------------------

# (category, [(task, how many records it makes), ...]); 1,200 records in all.
PLAN: list[tuple[str, list[tuple[Maker, int]]]] = [
    ("open_qa", [(capital, 80), (colour, 25), (opposite, 45)]),
    (
        "general_qa",
        [
            (plus, 35),
            (minus, 30),
            (times, 25),
            (calendar, 25),
            (count_words, 25),
            (reverse_list, 25),
            (sort_list, 25),
            (capitalize_phrase, 20),
            (copy_phrase, 15),
        ],
    ),
    ("closed_qa", [(closed_short, 155), (closed_long, 20)]),
    ("information_extraction", [(extract_one, 110), (extract_many, 15)]),
    ("summarization", [(summarize_short, 85), (summarize_long, 15)]),
    (
        "classification",
        [(sentiment, 75), (animal_or_vehicle, 25), (animal_or_vehicle_list, 40), (even_or_odd, 35)],
    ),
    ("brainstorming", [(brainstorm, 125)]),
    ("creative_writing", [(creative, 125)]),
]


def generate(seed: int = SEED) -> list[Record]:
    """Build all records; no two share the same (instruction, context)."""
    rng = random.Random(seed)
    seen: set[tuple[str, str]] = set()
    records: list[Record] = []
    for category, tasks in PLAN:
        for make, count in tasks:
            made, attempts = 0, 0
            while made < count:
                attempts += 1
                if attempts > 100 * count:
                    raise RuntimeError(f"{make.__name__}: could not make {count} distinct records")
                rec = make(rng)
                assert rec["category"] == category, (make.__name__, rec["category"])
                key = (rec["instruction"], rec["context"])
                if key not in seen:
                    seen.add(key)
                    records.append(rec)
                    made += 1
    rng.shuffle(records)
    return records


def to_jsonl(records: list[Record]) -> bytes:
    """One JSON object per line, sorted keys, UTF-8, trailing newline."""
    lines = [json.dumps(r, sort_keys=True, ensure_ascii=False) for r in records]
    return ("\n".join(lines) + "\n").encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    """Write the file, or with --check compare it with what would be written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help="where to write (default: the shipped file)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the file differs from what would be generated",
    )
    args = parser.parse_args(argv)

    records = generate()
    expected = to_jsonl(records)
    if args.check:
        if args.output.is_file() and args.output.read_bytes() == expected:
            print(f"{args.output} is up to date.")
            return 0
        print(
            f"{args.output} is missing or out of date; run python scripts/data/make_instructions.py",
            file=sys.stderr,
        )
        return 1

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(expected)
    print(f"Wrote {len(records)} records to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
