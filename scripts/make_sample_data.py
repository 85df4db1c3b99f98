"""Generate tfcli's sample data: a story corpus, a review classification set, a date seq2seq set.

Everything is produced here from small hand-written grammars and a seeded random generator
(standard library only), so the output is byte-for-byte reproducible:

    python scripts/make_sample_data.py            # writes sample_data/
    python scripts/make_sample_data.py --seed 1   # a different, equally valid draw

Files written under --out:
    corpus/stories.txt  simple children's stories, one per line, one blank line between stories
    reviews.jsonl       {"text": ..., "label": "positive" | "negative"}
    dates.jsonl         {"source": <a date in a human format>, "target": <ISO 8601 date>}
    chat_train.jsonl    {"messages": [...]}: word games (first word, last word, repeat), one or two exchanges
    chat_val.jsonl      more conversations drawn the same way over word triples not in training, for validation
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

STORIES_TARGET_BYTES = 500_000
N_REVIEWS = 3000
N_DATES = 8000
N_CHAT_TRAIN = 2000
N_CHAT_VAL = 200

# --------------------------------------------------------------------------------------------
# Small English helpers
# --------------------------------------------------------------------------------------------

NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]

IRREGULAR_PLURALS = {
    "mouse": "mice",
    "sheep": "sheep",
    "deer": "deer",
    "fish": "fish",
    "goose": "geese",
    "wolf": "wolves",
    "leaf": "leaves",
    "child": "children",
}

IRREGULAR_PAST = {
    "run": "ran",
    "swim": "swam",
    "sing": "sang",
    "draw": "drew",
    "read": "read",
    "fly": "flew",
    "build": "built",
    "ride": "rode",
    "catch": "caught",
    "make": "made",
    "go": "went",
    "dig": "dug",
    "find": "found",
    "eat": "ate",
    "throw": "threw",
    "sit": "sat",
    "see": "saw",
    "hide": "hid",
    "take": "took",
    "give": "gave",
    "have": "had",
    "get": "got",
    "spin": "spun",
    "sleep": "slept",
    "tell": "told",
    "blow": "blew",
    "write": "wrote",
    "feed": "fed",
}

# Verbs whose final consonant doubles before -ed / -ing.
DOUBLING = {"run", "swim", "dig", "skip", "hop", "sit", "spin", "clap", "nap", "jog", "stop", "hug", "drop", "tap", "pat", "shop", "plan"}


def a(word: str) -> str:
    """The indefinite article for `word`."""
    w = word.lower()
    if w.startswith(("uni", "use", "one", "eu")):
        return "a"
    return "an" if w[:1] in "aeiou" else "a"


def with_a(phrase: str) -> str:
    return f"{a(phrase)} {phrase}"


def plural(noun: str) -> str:
    *head, last = noun.split(" ")
    if last in IRREGULAR_PLURALS:
        last = IRREGULAR_PLURALS[last]
    elif last.endswith(("s", "x", "ch", "sh", "z")):
        last += "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        last = last[:-1] + "ies"
    else:
        last += "s"
    return " ".join([*head, last])


def count(n: int, noun: str) -> str:
    """`count(3, "apple")` -> "three apples"."""
    return f"{NUMBER_WORDS[n]} {noun if n == 1 else plural(noun)}"


def past(phrase: str) -> str:
    """Past tense of a verb phrase whose first word is the verb: "fly a kite" -> "flew a kite"."""
    verb, _, rest = phrase.partition(" ")
    if verb in IRREGULAR_PAST:
        verb = IRREGULAR_PAST[verb]
    elif verb in DOUBLING:
        verb = verb + verb[-1] + "ed"
    elif verb.endswith("e"):
        verb += "d"
    elif verb.endswith("y") and verb[-2] not in "aeiou":
        verb = verb[:-1] + "ied"
    else:
        verb += "ed"
    return f"{verb} {rest}".strip()


def gerund(phrase: str) -> str:
    """-ing form of a verb phrase: "ride a bike" -> "riding a bike"."""
    verb, _, rest = phrase.partition(" ")
    if verb in DOUBLING:
        verb = verb + verb[-1] + "ing"
    elif verb.endswith("e") and not verb.endswith("ee"):
        verb = verb[:-1] + "ing"
    else:
        verb += "ing"
    return f"{verb} {rest}".strip()


def cap(s: str) -> str:
    """Capitalize the first letter (skipping a leading quote), leaving the rest alone."""
    i = 1 if s.startswith('"') else 0
    return s[:i] + s[i : i + 1].upper() + s[i + 1 :]


# --------------------------------------------------------------------------------------------
# Story vocabulary
# --------------------------------------------------------------------------------------------

GIRL_NAMES = """
Lily Mia Emma Ava Sophie Lucy Anna Ella Grace Chloe Ruby Zoe Amy Sara Nora Hannah Ivy Rose Daisy
Molly Lila Maya Emily Olivia Isla Alice Clara Stella Hazel Luna Bella Layla Nina Kate Jenny Rosa
Tara Julia Eva Leah Mila Ellie Poppy Freya Holly Amber Jade Lola Kira Lena Ada Iris Mara Tessa
Wendy Penny Sally Polly Betty Dora Fiona Gina Hope Joy June Kim Lisa Megan Naomi Paula Rita Sadie
Tina Uma Vera Willa Yara Zara Abby Beth Cara Dana Erin Faith Gemma Heidi Ingrid Jess Kelly Lucia
Maria Nadia Olive Piper Rachel Sofia Talia Violet
""".split()

BOY_NAMES = """
Tom Ben Max Sam Leo Jack Tim Finn Jake Noah Liam Oliver Lucas Ethan Henry Oscar Theo Alex Adam
Ryan Dan Joe Luke Mark Nick Paul Pete Will Billy Bobby Charlie Danny Eddie Freddie George Harry
Ian Jamie Kevin Leon Milo Nate Otto Owen Pablo Ravi Rudy Seth Toby Victor Wes Zack Arlo Bruno
Caleb Dexter Elijah Felix Gus Hugo Isaac Jasper Kai Levi Mason Ned Omar Patrick Quentin Reuben
Simon Teddy Umar Vince Walter Xavier Yusuf Zane Aaron Bill Carl David Eric Frank Greg Hank Ivan
Jonas Kyle Louis Marco Nico Peter Rex Ricky Ted Ollie Ray Sid
""".split()

# Rarely drawn, so that tokenizers see some multi-byte UTF-8.
UNICODE_NAMES = [
    ("Zoë", "f"),
    ("Chloé", "f"),
    ("Renée", "f"),
    ("Amélie", "f"),
    ("Noémie", "f"),
    ("José", "m"),
    ("Björn", "m"),
    ("Søren", "m"),
    ("André", "m"),
    ("Jürgen", "m"),
]

PET_NAMES = """
Spot Buddy Fluffy Whiskers Coco Pip Sunny Biscuit Pepper Ziggy Bubbles Snowy Patch Sprout Muffin
Peanut Bongo Dot Fuzzy Rusty Button Ginger Honey Pickle Sparky Thumper Noodle Pebble Mochi Waffles
""".split()

ANIMALS = """
cat dog bird rabbit bunny fox bear mouse frog duck owl pig cow horse sheep goat lion tiger monkey
elephant turtle puppy kitten squirrel deer wolf hen chick bee butterfly ladybug snail dragon
penguin giraffe zebra hippo panda koala kangaroo crab whale dolphin seal parrot goose raccoon
hedgehog beaver otter lamb pony crow robin ant spider bat unicorn
""".split()

# Animals that make sense in counting walks.
COUNTABLE_ANIMALS = """
duck bird cow sheep horse goat frog rabbit butterfly bee ladybug squirrel deer hen chick pig
snail ant goose crow robin
""".split()

CHAR_ADJS = """
little small big kind happy shy brave silly curious friendly sleepy funny clever gentle tiny
young quiet cheerful smart playful busy proud grumpy careful old strong fast lonely
""".split()

COLORS = "red blue green yellow pink purple orange brown white black".split()
THING_ADJS = "shiny old new soft round striped golden silver bright tiny fuzzy pretty wooden".split()

TOYS = [
    "ball",
    "kite",
    "doll",
    "teddy bear",
    "toy car",
    "hat",
    "book",
    "balloon",
    "drum",
    "boat",
    "toy train",
    "robot",
    "puzzle",
    "yo-yo",
    "whistle",
    "bell",
    "basket",
    "ribbon",
    "marble",
    "crown",
    "umbrella",
    "scarf",
    "blanket",
    "bucket",
    "shovel",
    "wagon",
    "toy truck",
    "spinning top",
    "jump rope",
    "music box",
    "paper plane",
    "block tower",
    "sock puppet",
    "pinwheel",
]

FOODS = [
    "apple",
    "cookie",
    "cupcake",
    "banana",
    "carrot",
    "cherry",
    "strawberry",
    "orange",
    "pear",
    "plum",
    "muffin",
    "sandwich",
    "grape",
    "peach",
    "pie",
    "candy",
    "lemon",
    "nut",
    "berry",
    "acorn",
    "cracker",
    "pancake",
    "egg",
    "tomato",
    "biscuit",
]
FOODS_PLURAL = {"tomato": "tomatoes"}

# (place, preposition used for "at/in/on the place")
PLACES = [
    ("park", "in"),
    ("garden", "in"),
    ("forest", "in"),
    ("beach", "on"),
    ("lake", "by"),
    ("river", "by"),
    ("farm", "on"),
    ("school", "at"),
    ("yard", "in"),
    ("hill", "on"),
    ("meadow", "in"),
    ("zoo", "at"),
    ("shop", "at"),
    ("kitchen", "in"),
    ("backyard", "in"),
    ("pond", "by"),
    ("field", "in"),
    ("library", "at"),
    ("playground", "at"),
    ("cave", "in"),
    ("castle", "at"),
    ("town", "in"),
    ("village", "in"),
    ("market", "at"),
    ("bakery", "at"),
    ("barn", "in"),
    ("mountain", "on"),
    ("island", "on"),
    ("jungle", "in"),
    ("street", "on"),
    ("bridge", "on"),
    ("attic", "in"),
    ("woods", "in"),
    ("swamp", "in"),
    ("orchard", "in"),
]
UNICODE_PLACES = [("café", "at")]
PREPOSITION = dict(PLACES + UNICODE_PLACES)
# Outdoor places: for playing, finding things, and a house to stand near.
OUTDOOR_PLACES = ["park", "garden", "forest", "beach", "meadow", "field", "woods", "yard", "backyard", "hill", "orchard", "playground", "farm"]
NEAR_PLACES = [
    "park",
    "forest",
    "beach",
    "lake",
    "river",
    "farm",
    "hill",
    "meadow",
    "pond",
    "woods",
    "mountain",
    "castle",
    "orchard",
    "bridge",
    "field",
    "school",
    "market",
]


def at(place: str) -> str:
    """ "park" -> "in the park", "beach" -> "on the beach", "lake" -> "by the lake"."""
    return f"{PREPOSITION[place]} the {place}"


SPOTS = [
    "under the bed",
    "behind the tree",
    "under a rock",
    "in the tall grass",
    "behind the door",
    "under the table",
    "inside a box",
    "near the pond",
    "next to the fence",
    "under a big leaf",
    "on top of the shelf",
    "behind the couch",
    "in the sand",
    "under the bench",
    "by the gate",
    "in a bush",
    "under the stairs",
    "near the big tree",
    "in the toy box",
    "under a pile of leaves",
]

# (base verb phrase, suitable for animals too?)
ACTIVITIES = [
    ("play with a ball", True),
    ("run in the grass", True),
    ("jump in the leaves", True),
    ("play tag", True),
    ("play hide and seek", True),
    ("dance", True),
    ("sing songs", True),
    ("splash in the puddles", True),
    ("look for bugs", True),
    ("roll down the hill", True),
    ("chase butterflies", True),
    ("dig in the sand", True),
    ("swim in the pond", True),
    ("pick flowers", True),
    ("climb the big tree", True),
    ("hop around", True),
    ("look at the clouds", True),
    ("ride a bike", False),
    ("read a book", False),
    ("draw pictures", False),
    ("fly a kite", False),
    ("build a sandcastle", False),
    ("play catch", False),
    ("skip rope", False),
    ("paint", False),
    ("play on the swings", False),
    ("build a tower", False),
    ("collect shells", False),
]

INDOOR_ACTIVITIES = [
    "build a fort with pillows",
    "bake cookies",
    "play a board game",
    "draw pictures",
    "read a story",
    "make a puppet show",
    "paint a picture",
    "sing songs",
    "build a tower with blocks",
    "make paper boats",
    "have a tea party",
    "do a puzzle",
]

RELATIVES = [("mom", "f"), ("dad", "m"), ("grandma", "f"), ("grandpa", "m"), ("sister", "f"), ("brother", "m"), ("aunt", "f"), ("uncle", "m")]
PARENTS = ["mom", "dad"]

DIALOG_VERBS = ["said", "said", "said", "shouted", "whispered", "cried", "replied", "laughed"]

FEARS = [  # (what, the day it was faced, what they tried, how it went)
    ("the big slide", "went to the playground", "climbed up and slid down", "It was fast and fun!"),
    ("the deep water", "went to the lake", "jumped into the water", "The water was cool and nice."),
    ("the dark", "went up to the attic", "walked into the dark room with a small light", "There was nothing scary there at all."),
    ("the big waves", "went to the beach", "ran into the waves", "The waves tickled and made everyone laugh."),
    ("the tall tree", "went to the park", "climbed up, one branch at a time", "From the top, the whole town looked tiny."),
    ("the loud thunder", "stayed home during a big storm", "sat by the window and watched the storm", "The thunder was loud, but it could not hurt anyone."),
    ("the big dog next door", "went out to the yard", "held out a hand slowly", "The dog licked it and wagged its tail."),
    ("the old bridge", "went down to the river", "walked across the bridge step by step", "The bridge was strong and did not shake at all."),
    ("riding a bike", "went out to the street", "got on the bike and pushed the pedals", "Soon the bike was going fast, and it felt like flying."),
    ("the busy school", "went to school for the first time", "walked into the classroom and said hello", "Everyone smiled and said hello back."),
]

TREASURES = [  # (thing, what they did with it)
    ("old map", "followed the map to a big tree, where they found a box of toys"),
    ("small golden key", "used it to open an old box in the attic, and inside was a pretty music box"),
    ("shiny blue stone", "put it on the window so they could look at it every day"),
    ("long white feather", "used it to make a hat for a king"),
    ("little glass bottle", "filled it with sand and tiny shells"),
    ("round silver coin", "put it in a jar and saved it for a rainy day"),
    ("tiny red box", "opened it and found a ring that shined like the sun"),
    ("big smooth shell", "held it to their ears and heard the sound of the sea"),
    ("strange green egg", "kept it warm, and the next day a little bird came out"),
    ("secret note", "read it together, and it said that a picnic was waiting behind the barn"),
    ("magic wand", "waved it in the air, and the flowers began to dance"),
    ("old wooden boat", "fixed it and took it out on the pond"),
]

STUCK = [  # (where the animal was stuck, how the hero helped; {s}/{o} = the animal's pronouns, {p} = the hero's)
    ("up in a tall tree", "climbed up slowly and carried {o} down"),
    ("in the thick mud", "pulled {o} out of the mud with a long stick"),
    ("under a heavy log", "pushed the log away with all {p} strength"),
    ("in a deep hole", "found a rope and helped {o} climb out"),
    ("in a thorny bush", "moved the branches one by one until {s} was free"),
    ("in an old fishing net", "untied the net very carefully"),
    ("on a rock in the river", "put a long board across the water so {s} could walk back"),
    ("behind the fence", "opened the gate and let {o} out"),
]

ENCOUNTERS = [  # (how the animal felt, what the hero did; {o} = its object pronoun, {p} = its possessive)
    ("hungry", "gave {o} some food"),
    ("hungry", "shared a cookie with {o}"),
    ("sad", "gave {o} a big hug"),
    ("cold", "gave {o} a warm blanket"),
    ("tired", "let {o} rest on a soft pillow"),
    ("lost", "helped {o} find {p} way home"),
    ("thirsty", "gave {o} a bowl of water"),
    ("bored", "played a game with {o}"),
    ("scared", "sang {o} a soft song"),
    ("wet from the rain", "dried {o} with a towel"),
]

QUESTIONS = [  # (what the child noticed, the question, the answer)
    ("looked up at the night sky", "Why does the moon change shape?", "The moon does not really change. We just see a different part of it each night."),
    ("watched the rain fall", "Where does the rain come from?", "It comes from the clouds. When they get too full of water, the water falls down."),
    ("saw the leaves falling from the trees", "Why do the leaves fall?", "In the fall, the trees let their leaves go so they can rest in the winter."),
    ("heard a bird singing", "Why do birds sing?", "Birds sing to talk to each other."),
    ("saw a bee on a flower", "What is the bee doing?", "It is taking food from the flower to bring home."),
    ("watched the sun go down", "Where does the sun go at night?", "The sun does not go away. The world turns, and the sun shines on other places."),
    ("saw a big rainbow", "How is a rainbow made?", "When the sun shines through the rain, the light splits into many colors."),
    ("found a caterpillar on a leaf", "What will the caterpillar become?", "One day it will turn into a butterfly."),
    ("saw snow falling outside", "Why is snow cold?", "Snow is made of tiny bits of ice."),
    ("planted a seed in the garden", "How will the seed grow?", "It needs water, sun, and a lot of time."),
    ("tasted the water at the beach", "Why is the sea salty?", "Rivers carry tiny bits of salt from the rocks into the sea."),
    ("saw the stars come out", "How many stars are there?", "There are more stars than anyone can count."),
    ("watched the fish in the pond", "How do fish breathe under water?", "Fish take the air out of the water with their gills."),
    ("heard the thunder", "What makes the thunder so loud?", "Lightning makes the air shake, and we hear it as thunder."),
]

GOALS = [  # (what they wanted, the idea, the happy result)
    ("reach the cookie jar on the high shelf", "pushed a small chair to the shelf and stood on it", "took one cookie and shared it"),
    ("see over the tall fence", "climbed onto a big box", "saw a field full of horses"),
    ("get the red apple at the top of the tree", "asked a tall friend for help", "shared the apple with the friend"),
    ("ring the big bell at school", "stood on a step", "rang the bell so loud that everyone laughed"),
    ("reach the swing", "asked a friend to give a little push", "swung so high that it felt like flying"),
    ("carry a heavy basket home", "put the basket in a wagon", "pulled the wagon all the way home"),
]

DREAMS = [
    "fly over the town like a bird",
    "swim with the fish in the deep sea",
    "talk to the stars",
    "ride on the back of a friendly dragon",
    "walk on the moon",
    "live in a house made of candy",
    "be as big as a mountain",
    "sail a boat across the whole ocean",
]

ENDINGS_FRIENDS = [
    "From that day on, {h} and {f} were best friends.",
    "After that, {h} and {f} played together every day.",
    "{H} and {f} were friends forever.",
]
ENDINGS_DAY = ["It was the best day ever.", "Then everyone went home, tired and happy.", "That night, {h} fell asleep with a big smile."]

EMOJI = ["🙂", "🎈", "🌈", "🐱", "🐶", "⭐", "🍎", "❤️", "🌻", "🎉"]


# --------------------------------------------------------------------------------------------
# Characters
# --------------------------------------------------------------------------------------------

PRONOUNS = {"f": ("she", "her", "her"), "m": ("he", "him", "his"), "n": ("it", "it", "its")}


@dataclass
class Character:
    intro: str  # indefinite first mention, for "there was ...": "a little girl named Lily"
    first: str  # first mention as a sentence subject: "Lily", "a little cat"
    ref: str  # every later mention: "Lily", "the cat"
    kind: str  # "girl", "cat", ...
    gender: str  # "f", "m" or "n" (it)
    person: bool

    @property
    def subj(self) -> str:
        return PRONOUNS[self.gender][0]

    @property
    def obj(self) -> str:
        return PRONOUNS[self.gender][1]

    @property
    def poss(self) -> str:
        return PRONOUNS[self.gender][2]

    @property
    def Subj(self) -> str:
        return cap(self.subj)

    @property
    def Ref(self) -> str:
        return cap(self.ref)

    @property
    def refs(self) -> str:
        """Possessive of the reference: "Lily's", "the cat's"."""
        return self.ref + ("'" if self.ref.endswith("s") else "'s")


class StoryMaker:
    """Draws characters and places without repeating names or animal kinds inside one story."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: list[str] = []

    def choice(self, seq):
        return self.rng.choice(seq)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def _fresh(self, pool: list[str]) -> str:
        while True:
            x = self.rng.choice(pool)
            if x not in self.used:
                self.used.append(x)
                return x

    def name(self) -> tuple[str, str]:
        if self.chance(0.02):
            name, g = self.rng.choice(UNICODE_NAMES)
            if name not in self.used:
                self.used.append(name)
                return name, g
        if self.chance(0.5):
            return self._fresh(GIRL_NAMES), "f"
        return self._fresh(BOY_NAMES), "m"

    def person(self, friend_of: Character | None = None) -> Character:
        """A girl or boy; with `friend_of`, sometimes first mentioned as "her friend Ben"."""
        name, g = self.name()
        kind = "girl" if g == "f" else "boy"
        adj = self.choice(CHAR_ADJS) + " " if self.chance(0.6) else ""
        intro = f"{with_a(adj + kind)} {self.choice(['named', 'named', 'called'])} {name}"
        first = name
        if friend_of is not None and friend_of.person and self.chance(0.6):
            first = f"{friend_of.poss} friend {name}"
        elif self.chance(0.25):
            first = intro
        return Character(intro, first, name, kind, g, True)

    def animal(self, named: bool | None = None) -> Character:
        kind = self._fresh(ANIMALS)
        adj = self.choice(CHAR_ADJS)
        if named is None:
            named = self.chance(0.3)
        if named:
            pet = self._fresh(PET_NAMES)
            g = self.choice("fm")
            intro = f"{with_a(adj + ' ' + kind)} named {pet}"
            return Character(intro, intro, pet, kind, g, False)
        intro = with_a(f"{adj} {kind}") if self.chance(0.7) else with_a(kind)
        return Character(intro, intro, f"the {kind}", kind, "n", False)

    def hero(self, p_person: float = 0.7) -> Character:
        return self.person() if self.chance(p_person) else self.animal()

    def friend(self, hero: Character, p_person: float = 0.5) -> Character:
        return self.person(friend_of=hero) if self.chance(p_person) else self.animal()

    def place(self, outdoor: bool = False) -> str:
        if outdoor:
            return self.choice(OUTDOOR_PLACES)
        if self.chance(0.01):
            return self.choice(UNICODE_PLACES)[0]
        return self.choice(PLACES)[0]

    def activity(self, c: Character) -> str:
        return self.choice([act for act, animal_ok in ACTIVITIES if c.person or animal_ok])

    def toy(self) -> tuple[str, str]:
        """(described toy, bare toy): ("red kite", "kite")."""
        toy = self.choice(TOYS)
        adj = self.choice(COLORS + THING_ADJS) + " " if self.chance(0.7) else ""
        return adj + toy, toy

    def say(self, who: Character, line: str, verb: str | None = None) -> str:
        """A line of dialogue with an attribution, punctuated the usual way."""
        verb = verb or ("asked" if line.endswith("?") else self.choice(DIALOG_VERBS))
        lead = line[:-1] + "," if line.endswith(".") else line
        forms = [f'{who.Ref} {verb}, "{line}"', f'"{lead}" {who.ref} {verb}.']
        if who.ref[0].isupper():  # "said Lily" reads well; "said the cat" is fine too, "said she" is not
            forms.append(f'"{lead}" {verb} {who.ref}.')
        return self.choice(forms)

    def opening(self, h: Character) -> str:
        place = self.choice(NEAR_PLACES)
        forms = [
            f"Once upon a time, there was {h.intro}.",
            f"Once there was {h.intro}.",
            f"There was once {h.intro}.",
            f"{cap(h.intro)} lived in a small house near the {place}.",
            f"Long ago, in a small village, there lived {h.intro}.",
        ]
        if h.ref[0].isupper():
            forms.append(f"{h.Ref} was {with_a(self.choice(CHAR_ADJS) + ' ' + h.kind)}.")
        return self.choice(forms)

    def ending_friends(self, h: Character, f: Character) -> str:
        return self.choice(ENDINGS_FRIENDS).format(h=h.ref, H=h.Ref, f=f.ref)

    def ending_day(self, h: Character) -> str:
        return self.choice(ENDINGS_DAY).format(h=h.ref)


# A story is a list of parts; each part is (sentences, optional). Optional parts are kept with
# probability 1/2, then dropped at random until the story has at most 8 sentences, counted in
# the text: '"I am sorry. Here it is," said Ben.' is two sentences, '"Why?" she asked.' one.
Part = tuple[list[str], bool]
SENTENCE_END = re.compile(r'[.!?]"?(?=\s+["A-ZÀ-Þ]|\s*$)')
MIN_SENTENCES, MAX_SENTENCES = 3, 8


def n_sentences(text: str) -> int:
    return len(SENTENCE_END.findall(text))


def R(*sentences: str) -> Part:
    return list(sentences), False


def O(*sentences: str) -> Part:
    return list(sentences), True


# --------------------------------------------------------------------------------------------
# Story templates
# --------------------------------------------------------------------------------------------


def story_lost(m: StoryMaker) -> list[Part]:
    h = m.hero()
    f = m.friend(h)
    (toy, item), place = m.toy(), m.place()
    s1, s2, s3 = m.rng.sample(SPOTS, 3)
    return [
        R(m.opening(h)),
        O(f"{h.Subj} had {with_a(toy)} that {h.subj} loved very much."),
        R(f"One day, {h.ref} lost {h.poss} {toy} {at(place)}."),
        R(f"{h.Subj} looked {s1} and {s2}, but {h.subj} could not find it."),
        O(f"{h.Ref} was so sad that {h.subj} began to cry."),
        R(f'Then {f.first} came by and asked, "Why are you so sad?"'),
        O(m.say(h, f"I lost my {item}.")),
        R(f"{f.Ref} helped {h.obj} look, and soon {f.subj} found the {item} {s3}."),
        R(
            m.choice(
                [
                    f'{h.Ref} hugged {f.ref} and said, "Thank you!"',
                    f"{h.Ref} was happy again, and the two friends played until the sun went down.",
                    m.ending_friends(h, f),
                ]
            )
        ),
    ]


NEW_FRIEND_TALK = [  # (question, possible answers)
    ("Hi, can I play with you?", ["Yes, you can!", "Of course you can."]),
    ("Do you want to be my friend?", ["Yes, I would like that.", "I would love to be your friend!"]),
    ("Can we play together?", ["Yes, let's play!", "Of course we can."]),
    ("Why are you all alone?", ["I do not have any friends.", "Nobody wants to play with me."]),
]


def story_new_friend(m: StoryMaker) -> list[Part]:
    h = m.hero()
    f = m.person() if m.chance(0.5) else m.animal()  # a new friend, never "her friend Ben"
    place, act = m.place(outdoor=True), m.activity(f)
    question, answers = m.choice(NEW_FRIEND_TALK)
    return [
        R(m.opening(h)),
        O(f"{h.Subj} lived near the {m.choice(NEAR_PLACES)}."),
        R(f"{h.Subj} did not have any friends, so {h.subj} often felt lonely."),
        R(f"One day, {h.ref} went to the {place} and saw {f.first}."),
        O(f"{f.Subj} was {gerund(act)} all alone."),
        R(m.say(h, question)),
        R(m.say(f, m.choice(answers))),
        R(f"They {past(m.activity(f) if m.chance(0.5) else act)} together until it got dark."),
        R(m.choice([m.ending_friends(h, f), f"{h.Ref} was not lonely anymore."])),
    ]


def story_share(m: StoryMaker) -> list[Part]:
    h = m.hero()
    f = m.friend(h)
    food = m.choice(FOODS)
    n = m.rng.randint(3, 10)
    k = m.rng.randint(1, n - 1)
    foods = FOODS_PLURAL.get(food, plural(food))
    left = f"{NUMBER_WORDS[n - k]} {food if n - k == 1 else foods}"
    given = f"{NUMBER_WORDS[k]} {food if k == 1 else foods}"
    return [
        R(m.opening(h)),
        R(f"{h.Subj} had {NUMBER_WORDS[n]} {foods} in {h.poss} basket."),
        R(f"On the way to the {m.place()}, {h.subj} met {f.first}."),
        R(f"{f.Subj} looked sad because {f.subj} had nothing to eat."),
        R(m.say(h, f"Would you like some {foods}?")),
        R(f"{h.Ref} gave {f.ref} {given}, so now {h.subj} had {left} left."),
        O(m.say(f, m.choice(["Thank you! You are very kind.", "Thank you so much!"]))),
        R(
            m.choice(
                [
                    f"{h.Ref} felt happy because sharing made {h.obj} feel good.",
                    f"{h.Ref} learned that sharing is better than keeping everything.",
                    m.ending_friends(h, f),
                ]
            )
        ),
    ]


def story_rain(m: StoryMaker) -> list[Part]:
    h = m.hero(0.85)
    parent = m.choice(PARENTS)
    act, inside = m.activity(h), m.choice(INDOOR_ACTIVITIES)
    return [
        R(f"One {m.choice(['morning', 'day', 'Saturday', 'summer day'])}, {h.first} wanted to go outside and {act}."),
        R(f"But it was raining outside, so {h.subj} had to stay in the house."),
        O(f"{h.Ref} was sad and looked out of the window."),
        O(m.say(h, "When will the rain stop?")),
        R(f'{cap(h.poss)} {parent} saw {h.obj} and said, "Let\'s {inside} instead!"'),
        R(f"They {past(inside)} together, and it was a lot of fun."),
        O("Soon the rain stopped, and a big rainbow came out."),
        R(m.choice([f"{h.Ref} learned that rainy days can be fun too.", f"That night, {h.ref} fell asleep with a big smile."])),
    ]


def story_brave(m: StoryMaker) -> list[Part]:
    h = m.hero(0.8)
    f = m.friend(h)
    fear, outing, tried, result = m.choice(FEARS)
    return [
        R(m.opening(h)),
        R(f"{h.Subj} was afraid of {fear}."),
        O(f"Every time {h.subj} thought about it, {h.subj} wanted to run away."),
        R(f"One day, {h.ref} {outing} with {f.first}."),
        R(m.say(f, m.choice(["Do not be scared. I will stay with you.", "You can do it! I am right here.", "Why are you scared? I will help you."]))),
        R(f"{h.Ref} took a deep breath and {tried}."),
        R(result),
        R(f"Now {h.ref} was not afraid anymore, and {h.subj} felt very proud."),
    ]


def story_discovery(m: StoryMaker) -> list[Part]:
    h = m.hero()
    f = m.friend(h)
    thing, did = m.choice(TREASURES)
    return [
        R(f"One day, {h.first} was {gerund(m.activity(h))} {at(m.place(outdoor=True))} when {h.subj} saw something strange."),
        R(f"It was {with_a(thing)}."),
        R(f'"What is this?" {h.subj} wondered.'),
        R(f"{h.Subj} picked it up and ran to show it to {f.first}."),
        R(m.say(f, m.choice(["Wow, it is so pretty!", "I have never seen anything like it!", "Where did you find it?", "Let's find out what it does!"]))),
        R(f"Together, they {did}."),
        O(m.ending_day(h)),
    ]


def story_help(m: StoryMaker) -> list[Part]:
    h = m.hero(0.8)
    f = m.animal()
    where, how = m.choice(STUCK)
    return [
        R(f"{cap(h.first)} was walking {at(m.place(outdoor=True))} when {h.subj} heard a small sound."),
        R(f"{h.Subj} looked around and saw {f.first} stuck {where}."),
        R(f"{f.Subj} was scared and could not get out."),
        O(m.say(h, "Do not worry, I will help you!")),
        R(f"{h.Ref} {how.format(s=f.subj, o=f.obj, p=h.poss)}."),
        R(f"{f.Ref} was so happy that {f.subj} {m.choice(['jumped up and down', 'danced in a circle', 'made a happy sound', 'would not stop smiling'])}."),
        R(f"{h.Ref} felt proud because {h.subj} had helped a friend."),
    ]


def story_gift(m: StoryMaker) -> list[Part]:
    h = m.hero(0.85)
    rel, rg = m.choice(RELATIVES)
    rsub, robj, rposs = PRONOUNS[rg]
    n, color = m.rng.randint(2, 9), m.choice(COLORS)
    things = m.choice(["flower", "star", "heart", "bird", "tree", "sun", "fish", "butterfly"])
    return [
        R(f"{cap(h.first)} wanted to make a gift for {h.poss} {rel} because it was {rposs} birthday."),
        O(f"{h.Subj} got some paper, {NUMBER_WORDS[m.rng.randint(2, 8)]} crayons, and {with_a(m.choice(COLORS))} ribbon."),
        R(f"{h.Subj} drew {NUMBER_WORDS[n]} {color} {plural(things)} on a big card."),
        O(f"It was hard work, but {h.subj} did not give up."),
        R(f"When {h.poss} {rel} saw the card, {rsub} smiled and gave {h.obj} a big hug."),
        R(f'"This is the best gift ever!" said {h.poss} {rel}.'),
        O(f"{h.Ref} felt warm and happy inside."),
    ]


def story_race(m: StoryMaker) -> list[Part]:
    h = m.hero()
    f = m.friend(h)
    goal = m.choice(["the big tree", "the old fence", "the red barn", "the end of the street", "the pond", "the top of the hill"])
    return [
        R(f"{cap(h.first)} and {f.first} liked to race."),
        R(m.say(f, m.choice([f"Let's race to {goal}!", f"Who can get to {goal} first?"]))),
        R("They ran as fast as they could."),
        R(f"{f.Ref} was faster, but then {f.subj} tripped over a rock and fell down."),
        R(f"{h.Ref} stopped and helped {f.obj} get up."),
        O(m.say(f, "Why did you stop?"), m.say(h, "Because friends help each other.")),
        R(f"In the end, they walked to {goal} together, laughing all the way."),
    ]


def story_sorry(m: StoryMaker) -> list[Part]:
    h = m.hero()
    f = m.friend(h)
    toy, item = m.toy()
    return [
        R(f"{cap(h.first)} and {f.first} were playing {at(m.place())}."),
        R(f"{f.Ref} had {with_a(toy)}, and {h.ref} wanted it too."),
        R(f"So {h.ref} took the {item} without asking."),
        R(f"{f.Ref} was upset and started to cry."),
        O(f"{h.Ref} felt bad because {h.subj} knew it was wrong."),
        R(m.say(h, m.choice([f"I am sorry I took your {item}.", f"I am sorry, here is your {item} back."]), m.choice(["said", "whispered"]))),
        R(m.say(f, m.choice(["Thank you for saying sorry.", "It is okay, we can share it."]))),
        O(f"Then they played with the {item} together."),
        R(f"After that, {h.ref} always asked before taking things."),
    ]


def story_question(m: StoryMaker) -> list[Part]:
    h = m.hero(0.8)
    parent = m.choice(PARENTS)
    saw, q, ans = m.choice(QUESTIONS)
    return [
        R(
            f"{h.Ref} was a curious {h.kind} who asked a lot of questions."
            if h.ref[0].isupper()
            else f"There was once a curious {h.kind} who asked a lot of questions."
        ),
        R(f"One day, {h.subj} {saw}."),
        R(f'"{q}" {h.subj} asked {h.poss} {parent}.'),
        R(f'{cap(h.poss)} {parent} smiled and said, "{ans}"'),
        O(f"{h.Ref} thought about it for a long time."),
        R(m.choice([f'"I want to learn everything!" said {h.ref}.', f"{h.Subj} could not wait to ask another question the next day."])),
    ]


def story_count(m: StoryMaker) -> list[Part]:
    h = m.hero(0.85)
    parent = m.choice(PARENTS)
    a1, a2, a3 = m.rng.sample(COUNTABLE_ANIMALS, 3)
    n1, n2 = m.rng.randint(2, 9), m.rng.randint(2, 9)
    return [
        R(f"{cap(h.first)} went for a walk to the {m.choice(['farm', 'pond', 'meadow', 'park', 'field'])} with {h.poss} {parent}."),
        R(f"On the way, {h.subj} counted everything {h.subj} saw."),
        R(f"{h.Subj} saw {count(n1, a1)}, {count(n2, a2)}, and {with_a(a3)}."),
        O(f'"How many animals did you see?" asked {h.poss} {parent}.', m.say(h, f"I saw {NUMBER_WORDS[n1 + n2 + 1]}!")),
        R(f"{cap(h.poss)} {parent} was proud because {h.ref} could count so well."),
        O(f"When they got home, {h.ref} drew a picture of all the animals."),
    ]


def story_short(m: StoryMaker) -> list[Part]:
    h = m.hero()
    f = m.animal(named=False)
    feel, did = m.choice(ENCOUNTERS)
    return [
        R(f"{cap(h.first)} went to the {m.place()}."),
        R(f"There, {h.subj} saw {f.first}."),
        R(f"{f.Subj} was {feel}, so {h.ref} {did.format(o=f.obj, p=f.poss)}."),
        O(f"{f.Ref} was happy, and {h.ref} was happy too."),
    ]


def story_goal(m: StoryMaker) -> list[Part]:
    h = m.person()
    want, idea, result = m.choice(GOALS)
    return [
        R(m.opening(h)),
        R(f"{h.Subj} wanted to {want}, but {h.subj} was too small."),
        O(f"{h.Subj} tried and tried, but it was no use."),
        R(f"Then {h.subj} had an idea."),
        R(f"{h.Subj} {idea}."),
        R(f"It worked, and {h.ref} {result}."),
        O(f'"I did it!" {h.subj} shouted.'),
    ]


def story_bedtime(m: StoryMaker) -> list[Part]:
    h = m.hero(0.8)
    parent = m.choice(PARENTS)
    animal = m.choice(ANIMALS)
    return [
        R(f"{cap(h.first)} did not want to go to sleep."),
        R(f'"But I am not tired!" {h.subj} said to {h.poss} {parent}.'),
        R(f"{cap(h.poss)} {parent} told {h.obj} a story about {with_a(m.choice(CHAR_ADJS) + ' ' + animal)} who {past(m.choice(ACTIVITIES)[0])}."),
        O(f"Soon {h.refs} eyes felt heavy."),
        R(f"That night, {h.subj} dreamed that {h.subj} could {m.choice(DREAMS)}."),
        R(f"In the morning, {h.subj} woke up with a big smile."),
    ]


TEMPLATES = [
    story_lost,
    story_new_friend,
    story_share,
    story_rain,
    story_brave,
    story_discovery,
    story_help,
    story_gift,
    story_race,
    story_sorry,
    story_question,
    story_count,
    story_short,
    story_goal,
    story_bedtime,
]


def render(parts: list[Part], rng: random.Random) -> str | None:
    """Join the parts into one paragraph, or None when even the required parts are too long."""
    kept = [(sents, opt) for sents, opt in parts if not opt or rng.random() < 0.5]

    def text() -> str:
        return " ".join(cap(s) for sents, _ in kept for s in sents)

    while n_sentences(text()) > MAX_SENTENCES:
        optional = [i for i, (_, opt) in enumerate(kept) if opt]
        if not optional:
            return None
        del kept[rng.choice(optional)]
    assert n_sentences(text()) >= MIN_SENTENCES, text()
    return text()


def make_stories(rng: random.Random, target_bytes: int = STORIES_TARGET_BYTES) -> list[str]:
    stories: list[str] = []
    size = 0
    while size < target_bytes:
        text = render(rng.choice(TEMPLATES)(StoryMaker(rng)), rng)
        if text is None:
            continue
        if rng.random() < 0.01:
            text += " " + rng.choice(EMOJI)
        stories.append(text)
        size += len(text.encode("utf-8")) + 2
    return stories


# --------------------------------------------------------------------------------------------
# Reviews
# --------------------------------------------------------------------------------------------

PRODUCTS = [
    "pair of headphones",
    "blender",
    "backpack",
    "phone case",
    "lamp",
    "desk chair",
    "coffee maker",
    "keyboard",
    "water bottle",
    "vacuum cleaner",
    "jacket",
    "pair of shoes",
    "tent",
    "kettle",
    "watch",
    "charger",
    "toaster",
    "umbrella",
    "mouse pad",
    "speaker",
    "suitcase",
    "pillow",
]

DOMAINS = {
    "movie": {
        "subjects": ["This movie", "The film", "This show", "The sequel", "This documentary", "The series", "This cartoon"],
        "aspects": [
            "the acting",
            "the story",
            "the plot",
            "the ending",
            "the music",
            "the soundtrack",
            "the dialogue",
            "the special effects",
            "the pacing",
            "the characters",
            "the jokes",
            "the cast",
            "the first half",
            "the villain",
            "the script",
        ],
        "again": ("I would watch it again.", "I will never watch it again."),
        "neutral": [
            "I watched it with my family.",
            "We saw it on a Sunday afternoon.",
            "I went to see it with two friends.",
            "It is about two hours long.",
            "My sister picked it for movie night.",
            "I watched it on a long flight.",
        ],
    },
    "restaurant": {
        "subjects": ["This place", "The restaurant", "This café", "The diner", "This bakery", "The pizza place", "This bistro", "The new sushi bar"],
        "aspects": [
            "the food",
            "the service",
            "the staff",
            "the pasta",
            "the soup",
            "the dessert",
            "the prices",
            "the portions",
            "the atmosphere",
            "the coffee",
            "the pizza",
            "the waiter",
            "the fries",
            "the bread",
            "the salad",
        ],
        "again": ("I will definitely come back.", "I will never eat here again."),
        "neutral": [
            "We went there on a Friday night.",
            "We ordered the soup and two salads.",
            "I came here for lunch with a coworker.",
            "We had a table by the window.",
            "It was my first visit.",
            "We went for my friend's birthday.",
        ],
    },
    "product": {
        "subjects": ["This {p}", "The {p}", "My new {p}", "This {p} I bought"],
        "aspects": [
            "the battery",
            "the sound",
            "the build quality",
            "the price",
            "the design",
            "the size",
            "the material",
            "the instructions",
            "the delivery",
            "the packaging",
            "the buttons",
            "the color",
            "the handle",
            "the zipper",
        ],
        "again": ("I would buy it again.", "I would never buy it again."),
        "neutral": [
            "I bought it last month.",
            "It arrived on a Tuesday.",
            "I got it as a gift for my brother.",
            "I have used it for two weeks now.",
            "I ordered the black one.",
            "It came in a small box.",
        ],
    },
}
PLURAL_ASPECTS = {"the characters", "the jokes", "the special effects", "the prices", "the portions", "the fries", "the instructions", "the buttons"}

POS_ADJS = [
    "great",
    "excellent",
    "amazing",
    "fantastic",
    "wonderful",
    "superb",
    "lovely",
    "impressive",
    "outstanding",
    "good",
    "nice",
    "solid",
    "decent",
    "pleasant",
    "brilliant",
    "perfect",
]
NEG_ADJS = [
    "terrible",
    "awful",
    "horrible",
    "poor",
    "disappointing",
    "bad",
    "weak",
    "mediocre",
    "dreadful",
    "lousy",
    "sloppy",
    "boring",
    "annoying",
    "unpleasant",
    "bland",
    "forgettable",
]
# Adjectives that read naturally after "not": "not bad" leans positive, "not great" negative.
NOT_NEG = ["bad", "terrible", "awful", "disappointing", "boring", "horrible"]
NOT_POS = ["great", "good", "impressive", "worth it", "very good", "nice", "special"]
STRONG_ADJS = {"excellent", "amazing", "fantastic", "wonderful", "superb", "outstanding", "brilliant", "perfect", "terrible", "awful", "horrible", "dreadful"}


def graded(rng: random.Random, adjs: list[str]) -> str:
    """An adjective, sometimes with a fitting adverb: "really good", "absolutely terrible"."""
    adj = rng.choice(adjs)
    adverbs = ["absolutely ", "truly ", "just "] if adj in STRONG_ADJS else ["really ", "very ", "pretty ", "quite "]
    return (rng.choice(adverbs) if rng.random() < 0.4 else "") + adj


POS_SHORT = [
    "I loved it.",
    "Highly recommended.",
    "I really enjoyed it.",
    "Five stars.",
    "Four stars.",
    "Worth every penny.",
    "What a pleasant surprise.",
    "It made my day.",
    "I am very happy with it.",
    "No complaints at all.",
    "I would not change a thing.",
    "Everyone should try it.",
]
NEG_SHORT = [
    "I hated it.",
    "Avoid it.",
    "What a waste of money.",
    "One star.",
    "Two stars.",
    "Total waste of time.",
    "I want my money back.",
    "I am very unhappy with it.",
    "Never again.",
    "I would not recommend it.",
    "Do not bother.",
    "It ruined my evening.",
]


def review_subject(rng: random.Random, domain: str) -> str:
    s = rng.choice(DOMAINS[domain]["subjects"])
    return s.format(p=rng.choice(PRODUCTS)) if "{p}" in s else s


def be(aspect: str) -> str:
    return "were" if aspect in PLURAL_ASPECTS else "was"


def review_main(rng: random.Random, domain: str, pos: bool) -> str:
    """One sentence carrying the label; plain, negated, or contrastive (the clause after "but" decides)."""
    good, bad = (POS_ADJS, NEG_ADJS) if pos else (NEG_ADJS, POS_ADJS)
    not_this, not_that = (NOT_NEG, NOT_POS) if pos else (NOT_POS, NOT_NEG)
    d = DOMAINS[domain]
    subj = review_subject(rng, domain)
    asp1, asp2 = rng.sample(d["aspects"], 2)
    kind = rng.choices(["plain", "negated", "contrast"], weights=[50, 25, 25])[0]
    if kind == "plain":
        return rng.choice(
            [
                f"{subj} was {graded(rng, good)}.",
                f"{cap(asp1)} {be(asp1)} {rng.choice(good)} and {asp2} {be(asp2)} {rng.choice(good)}.",
                f"{cap(asp1)} {be(asp1)} {graded(rng, good)}.",
                rng.choice(POS_SHORT if pos else NEG_SHORT),
                d["again"][0 if pos else 1],
            ]
        )
    if kind == "negated":
        return rng.choice(
            [
                f"{cap(asp1)} {be(asp1)} not {rng.choice(not_this)}.",
                f"{subj} was not {rng.choice(not_this)} at all.",
                f"Honestly, {asp1} {be(asp1)} not {rng.choice(not_this)}.",
                f"Nothing about {subj[0].lower() + subj[1:]} was {rng.choice(bad)}."
                if pos
                else f"There was nothing {rng.choice(POS_ADJS)} about {subj[0].lower() + subj[1:]}.",
                "I could not find anything wrong with it." if pos else "I did not like it at all.",
            ]
        )
    return rng.choice(
        [
            f"{cap(asp1)} {be(asp1)} {rng.choice(bad)}, but {asp2} {be(asp2)} {rng.choice(good)}.",
            f"I expected it to be {rng.choice(bad)}, but it was {graded(rng, good)}.",
            f"At first I thought it was {rng.choice(bad)}, but it turned out to be {rng.choice(good)}.",
            f"Although {asp1} {be(asp1)} {rng.choice(bad)}, overall it was {rng.choice(good)}.",
            f"{cap(asp1)} {be(asp1)} not {rng.choice(not_that)}, but overall {subj[0].lower() + subj[1:]} was {rng.choice(good)}.",
        ]
    )


def review_extra(rng: random.Random, domain: str, pos: bool) -> str:
    d = DOMAINS[domain]
    if rng.random() < 0.45:
        return rng.choice(d["neutral"])
    if rng.random() < 0.5:
        return rng.choice(POS_SHORT if pos else NEG_SHORT)
    asp = rng.choice(d["aspects"])
    return f"{cap(asp)} {be(asp)} {graded(rng, POS_ADJS if pos else NEG_ADJS)}."


def make_reviews(rng: random.Random, n: int = N_REVIEWS) -> list[dict]:
    seen: dict[str, str] = {}  # text -> label; a dict (not a set) so iteration order is reproducible
    labels = [i % 2 == 0 for i in range(n)]
    for pos in labels:
        while True:
            domain = rng.choice(list(DOMAINS))
            sentences = [review_main(rng, domain, pos)]
            for _ in range(rng.choices([0, 1, 2], weights=[30, 45, 25])[0]):
                extra = review_extra(rng, domain, pos)
                if extra not in sentences:
                    sentences.insert(rng.randint(0, len(sentences)), extra)
            text = " ".join(sentences)
            if text not in seen:
                seen[text] = "positive" if pos else "negative"
                break
    rows = [{"text": t, "label": lab} for t, lab in seen.items()]
    rng.shuffle(rows)
    return rows


# --------------------------------------------------------------------------------------------
# Dates
# --------------------------------------------------------------------------------------------

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
FIRST_DAY, LAST_DAY = dt.date(1950, 1, 1), dt.date(2049, 12, 31)


def ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def month_abbr_dot(m: int) -> str:
    name = MONTHS[m - 1]
    return name if len(name) <= 4 else name[:3] + "."  # "May", "June", "July" stay whole; "Sep." not "Sept."


# Every format is unambiguous: the only numeric day/month orders are US slashes (M/D/Y) and
# European dots (D.M.Y), so the separator tells them apart. Two-digit years pivot at 50:
# 50-99 mean 1950-1999 and 00-49 mean 2000-2049, which covers the whole range.
DATE_FORMATS = {
    "Month D, YYYY": lambda d, M, W: f"{M} {d.day}, {d.year}",
    "Mon D, YYYY": lambda d, M, W: f"{M[:3]} {d.day}, {d.year}",
    "Mon. D, YYYY": lambda d, M, W: f"{month_abbr_dot(d.month)} {d.day}, {d.year}",
    "D Month YYYY": lambda d, M, W: f"{d.day} {M} {d.year}",
    "d month yyyy": lambda d, M, W: f"{d.day} {M.lower()} {d.year}",
    "Dth Month YYYY": lambda d, M, W: f"{ordinal(d.day)} {M} {d.year}",
    "Weekday, Dth of Month YYYY": lambda d, M, W: f"{W}, {ordinal(d.day)} of {M} {d.year}",
    "Weekday, Month D, YYYY": lambda d, M, W: f"{W}, {M} {d.day}, {d.year}",
    "Wkd, D Mon YYYY": lambda d, M, W: f"{W[:3]}, {d.day} {M[:3]} {d.year}",
    "the Dth of Month, YYYY": lambda d, M, W: f"the {ordinal(d.day)} of {M}, {d.year}",
    "Month Dth, YYYY": lambda d, M, W: f"{M} {ordinal(d.day)}, {d.year}",
    "MONTH D, YYYY": lambda d, M, W: f"{M.upper()} {d.day}, {d.year}",
    "D-Mon-YYYY": lambda d, M, W: f"{d.day}-{M[:3]}-{d.year}",
    "weekday month d yyyy": lambda d, M, W: f"{W.lower()} {M.lower()} {d.day} {d.year}",
    "MM/DD/YYYY (US)": lambda d, M, W: f"{d.month:02d}/{d.day:02d}/{d.year}",
    "M/D/YY (US)": lambda d, M, W: f"{d.month}/{d.day}/{d.year % 100:02d}",
    "DD.MM.YYYY": lambda d, M, W: f"{d.day:02d}.{d.month:02d}.{d.year}",
    "D.M.YY": lambda d, M, W: f"{d.day}.{d.month}.{d.year % 100:02d}",
    "YYYY/MM/DD": lambda d, M, W: f"{d.year}/{d.month:02d}/{d.day:02d}",
    "YYYYMMDD": lambda d, M, W: f"{d.year}{d.month:02d}{d.day:02d}",
}


def make_dates(rng: random.Random, n: int = N_DATES) -> list[dict]:
    span = (LAST_DAY - FIRST_DAY).days
    formats = list(DATE_FORMATS.values())
    seen: dict[str, str] = {}
    while len(seen) < n:
        d = FIRST_DAY + dt.timedelta(days=rng.randint(0, span))
        source = rng.choice(formats)(d, MONTHS[d.month - 1], WEEKDAYS[d.weekday()])
        seen.setdefault(source, d.isoformat())
    rows = [{"source": s, "target": t} for s, t in seen.items()]
    rng.shuffle(rows)
    return rows


# --------------------------------------------------------------------------------------------
# Chat: word games a small transformer learns by attention (copying words from the question)
# --------------------------------------------------------------------------------------------

CHAT_SYSTEM = "You play word games."
CHAT_WORDS = (
    "fox dog cat bird ball tree park apple bear frog duck fish hat box boat kite sun moon rain book bed door red blue green "
    "big small happy sad little old new cold tall soft fast slow girl boy mom dad friend rabbit mouse owl horse cow pig lion "
    "garden river hill house car train toy sock"
).split()  # words of the stories that their tokenizer keeps whole after a space
CHAT_GAMES = {
    "first": (("What is the first word of: {words}?", "Which word comes first in: {words}?"), "It is {first}."),
    "last": (("What is the last word of: {words}?", "Which word comes last in: {words}?"), "It is {last}."),
    "repeat": (("Repeat after me: {words}.", "Say this back: {words}."), "Sure: {words}."),
}
CHAT_FOLLOW_UP = "And now: {question}"
CHAT_TWO_EXCHANGES = 0.3  # the share of conversations with a second exchange (a game on other words)


def chat_instance(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    """A game and the three words it is played on."""
    return rng.choice(sorted(CHAT_GAMES)), tuple(rng.sample(CHAT_WORDS, 3))


def chat_exchange(rng: random.Random, game: str, words: tuple[str, ...]) -> tuple[str, str]:
    questions, answer = CHAT_GAMES[game]
    fields = {"words": " ".join(words), "first": words[0], "last": words[-1]}
    return rng.choice(questions).format(**fields), answer.format(**fields)


def chat_conversation(rng: random.Random, instances: list[tuple[str, tuple[str, ...]]]) -> dict:
    """One or two exchanges over `instances`, half of them after a system message."""
    messages = [{"role": "system", "content": CHAT_SYSTEM}] if rng.random() < 0.5 else []
    for turn, (game, words) in enumerate(instances):
        question, answer = chat_exchange(rng, game, words)
        messages.append({"role": "user", "content": CHAT_FOLLOW_UP.format(question=question) if turn else question})
        messages.append({"role": "assistant", "content": answer})
    return {"messages": messages}


def make_chat(rng: random.Random, n_train: int = N_CHAT_TRAIN, n_val: int = N_CHAT_VAL) -> tuple[list[dict], list[dict]]:
    """Training and validation conversations; no game is played on the same three words in both files, so the
    validation questions are new to a model trained on the first (it must copy, not remember)."""
    train, seen = [], set()
    for _ in range(n_train):
        instances = [chat_instance(rng) for _ in range(2 if rng.random() < CHAT_TWO_EXCHANGES else 1)]
        seen.update(instances)
        train.append(chat_conversation(rng, instances))
    val: list[dict] = []
    while len(val) < n_val:
        instances = [chat_instance(rng) for _ in range(2 if rng.random() < CHAT_TWO_EXCHANGES else 1)]
        if not seen & set(instances):
            val.append(chat_conversation(rng, instances))
    return train, val


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> None:
    default_out = Path(__file__).resolve().parent.parent / "sample_data"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out, help=f"output folder (default: {default_out})")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    args = parser.parse_args(argv)

    # One independent generator per file, so changing one generator leaves the other files alone.
    stories = make_stories(random.Random(f"stories-{args.seed}"))
    reviews = make_reviews(random.Random(f"reviews-{args.seed}"))
    dates = make_dates(random.Random(f"dates-{args.seed}"))
    chat_train, chat_val = make_chat(random.Random(f"chat-{args.seed}"))

    write_text(args.out / "corpus" / "stories.txt", "\n\n".join(stories) + "\n")
    write_jsonl(args.out / "reviews.jsonl", reviews)
    write_jsonl(args.out / "dates.jsonl", dates)
    write_jsonl(args.out / "chat_train.jsonl", chat_train)
    write_jsonl(args.out / "chat_val.jsonl", chat_val)
    print(f"wrote {len(stories)} stories, {len(reviews)} reviews, {len(dates)} dates, {len(chat_train)} + {len(chat_val)} chats to {args.out}")


if __name__ == "__main__":
    main()
