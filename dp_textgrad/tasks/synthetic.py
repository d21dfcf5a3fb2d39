"""The built-in private task: customer-support messages with fake personal data.

``make_support_task`` generates, from a seed and without any download, messages
sent to the support desk of a bank-and-telecom provider. Each message has one
intent, named by a short label: ``bill`` (charges, fees, refunds), ``tech`` (something
does not work), ``cancel`` (ending a service or account), ``fraud`` (unauthorised use,
scams, stolen cards) and ``update`` (changing personal details).
Private and test messages carry FAKE personal data (generated names, phone and
account numbers, e-mail and street addresses, dates, amounts); the public split
uses placeholders such as ``[name]`` instead, so it holds no personal data at all.

Why it is not a keyword task: a share of the messages (``hard_fraction``) is
built so that the obvious keyword points to the wrong label:

- negations ("This isn't about my bill." before a ``tech`` request);
- a second, background topic ("I sorted my bill out last week." then a fraud report),
  or a threat that is not the request ("... or I will cancel" on a billing complaint);
- indirect phrasing without the label's usual words ("the light on the box keeps
  flashing orange" is tech).

Label words: Gemma 3 270M (the default local model) is scored on the log-probability
of each label word after "Category:". With the longer names "billing", "technical",
"cancellation", "account" it almost never predicted "technical" or "cancellation"
under any prompt we tried, and "account" is copied from every "my account number is"
line; the short words above are the set where prompts make the largest difference
(see docs/tasks.md for the measurements).

All other variety (greetings, sign-offs, politeness, lower-case, typos, lengths)
is added around the request. Everything is drawn from ``random.Random`` streams
derived from the seed with ``numpy.random.SeedSequence``, so a seed fixes the task.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.base import ClassificationTask, Example, ScoreKind

SUPPORT_LABELS: tuple[str, ...] = ("bill", "tech", "cancel", "fraud", "update")

SUPPORT_DESCRIPTION = (
    "Messages written by customers to the support desk of a bank and telecom provider. "
    "Each message has one main request, and the task is to name its category with one word: "
    "bill (wrong charges, bills, fees, refunds, payments), "
    "tech (a service, device, app or connection not working), "
    "cancel (ending a contract, subscription, line or account), "
    "fraud (unauthorised payments, scams, phishing, lost or stolen cards, someone else in the account), "
    "update (changing personal details such as address, phone number, e-mail, name or login). "
    "Messages may mention other topics in passing or deny them; only the main request counts. "
    "Private messages contain personal data (names, phone and account numbers, addresses)."
)

SUPPORT_RECORD_TEMPLATE = "Message: {text}\nCategory:"

# Deliberately weak: no label list, no definition; the optimiser must find the rest.
SUPPORT_SEED_PROMPT = "Read the message."

# Default share of messages built to defeat keyword matching (see the module docstring).
DEFAULT_HARD_FRACTION = 0.45

# ----------------------------------------------------------------------------------
# Fake personal data. Names avoid ordinary English words ("Bill", "Grace", "Chase")
# so tests can detect them with a regex.
FIRST_NAMES = (
    "Amara", "Bogdan", "Chiara", "Dmitri", "Elif", "Farouk", "Gunnar", "Hana", "Ishaan", "Jolene",
    "Kwame", "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosalind", "Sven", "Tomasz",
    "Ursula", "Vikram", "Weronika", "Ximena", "Yusuf", "Zofia", "Aiden", "Beatriz", "Connor", "Delphine",
    "Emeka", "Freya", "Gideon", "Hiroshi", "Ingrid", "Jasper", "Keiko", "Leandro", "Maeve", "Nikhil",
)
LAST_NAMES = (
    "Okafor", "Lindqvist", "Moreau", "Kowalski", "Tanaka", "Haddad", "Fitzgerald", "Novak", "Ramirez",
    "Schneider", "Oyelaran", "Castellano", "Petrov", "Nakamura", "Brennan", "Achterberg", "Varga",
    "Quispe", "Sorensen", "Abernathy", "Rasmussen", "Teixeira", "Dubois", "Halloran", "Ivanova",
    "Jaramillo", "Kaczmarek", "Lachance", "Mwangi", "Nieminen", "Ortega", "Pellegrini", "Rautio",
    "Szabo", "Takahashi", "Udeh", "Valdivia", "Whitcombe",
)
_STREETS = ("Maple", "Harbour", "Elm", "Kingfisher", "Station", "Mill", "Orchard", "Quarry", "Willow",
            "Beacon", "Chestnut", "Foundry", "Heron", "Juniper")
_STREET_KINDS = ("Road", "Street", "Lane", "Avenue", "Close", "Drive", "Way", "Crescent")
_CITIES = ("Ashford", "Riverton", "Dunmore", "Lakeside", "Brampton", "Fairview", "Northgate", "Kelso")
_EMAIL_DOMAINS = ("example.com", "example.net", "example.org", "mail.example", "inbox.test")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")

# Placeholders of the public split: same slots, no personal data.
PUBLIC_PLACEHOLDERS = {
    "name": "[name]", "first": "[first name]", "last": "[last name]", "phone": "[phone]",
    "acct": "[account number]", "email": "[email]", "address": "[address]", "date": "[date]",
    "date2": "[date]", "other_name": "[name]", "amount": "[amount]", "amount2": "[amount]", "card4": "[card digits]",
    "ref": "[reference]",
}
PII_SLOTS = frozenset(PUBLIC_PLACEHOLDERS)

# Public, non-personal vocabulary shared by every split.
_VOCAB = {
    "service": ("internet", "broadband", "fibre connection", "mobile plan", "TV package", "landline",
                "phone contract", "streaming add-on", "home phone line"),
    "device": ("router", "modem", "phone", "set-top box", "TV box", "wifi hub"),
    "app": ("the app", "the mobile app", "online banking", "the website", "the customer portal"),
    "rival": ("another provider", "a cheaper company", "a different network", "a competitor"),
    "card": ("debit card", "credit card", "bank card", "card"),
}


def _digits(rng: random.Random, n: int) -> str:
    return "".join(str(rng.randrange(10)) for _ in range(n))


def _fake_value(slot: str, rng: random.Random, person: tuple[str, str]) -> str:
    first, last = person
    if slot == "name":
        return f"{first} {last}"
    if slot == "other_name":  # someone other than the sender
        return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
    if slot == "first":
        return first
    if slot == "last":
        return last
    if slot == "phone":
        return rng.choice((
            lambda: f"(555) 01{_digits(rng, 1)}-{_digits(rng, 4)}",
            lambda: f"+44 7700 900{_digits(rng, 3)}",
            lambda: f"07{_digits(rng, 3)} {_digits(rng, 6)}",
            lambda: f"555-{_digits(rng, 3)}-{_digits(rng, 4)}",
            lambda: f"+1 202 555 0{_digits(rng, 3)}",
        ))()
    if slot == "acct":
        return rng.choice((
            lambda: _digits(rng, rng.choice((8, 10, 12))),
            lambda: f"AC-{_digits(rng, 7)}",
            lambda: f"{_digits(rng, 4)}-{_digits(rng, 4)}-{_digits(rng, 2)}",
        ))()
    if slot == "email":
        sep = rng.choice((".", "_", ""))
        return f"{first.lower()}{sep}{last.lower()}{rng.randrange(1, 99)}@{rng.choice(_EMAIL_DOMAINS)}"
    if slot == "address":
        return (f"{rng.randrange(1, 240)} {rng.choice(_STREETS)} {rng.choice(_STREET_KINDS)}, "
                f"{rng.choice(_CITIES)}")
    if slot in ("date", "date2"):
        day = rng.randrange(1, 29)
        return rng.choice((
            lambda: f"{rng.choice(_MONTHS)} {day}",
            lambda: f"{day:02d}/{rng.randrange(1, 13):02d}/{rng.choice((2023, 2024, 2025))}",
            lambda: f"the {day}{'th' if 4 <= day <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th')}",
        ))()
    if slot in ("amount", "amount2"):
        currency = rng.choice(("$", "£", "€"))
        return f"{currency}{rng.randrange(5, 950)}.{_digits(rng, 2)}"
    if slot == "card4":
        return _digits(rng, 4)
    if slot == "ref":
        return f"#{rng.choice('ABCDEFGHKLMNPRTX')}{rng.choice('ABCDEFGHKLMNPRTX')}{_digits(rng, 5)}"
    raise KeyError(slot)


class _SlotFiller(dict):
    """Fills ``{slot}`` fields for one message, keeping a slot's value fixed within it."""

    def __init__(self, rng: random.Random, with_pii: bool) -> None:
        super().__init__()
        self._rng = rng
        self._with_pii = with_pii
        self._person = (rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES))
        self.used_pii = False

    def __missing__(self, slot: str) -> str:
        if slot in _VOCAB:
            return self._rng.choice(_VOCAB[slot])  # may differ between sentences: that is fine
        if slot not in PII_SLOTS:
            raise KeyError(f"template slot {{{slot}}} is unknown")
        self.used_pii = True
        value = _fake_value(slot, self._rng, self._person) if self._with_pii else PUBLIC_PLACEHOLDERS[slot]
        self[slot] = value
        return value


# ----------------------------------------------------------------------------------
# Requests. "direct" ones use the label's usual words; "indirect" ones avoid them.
_DIRECT: dict[str, tuple[str, ...]] = {
    "bill": (
        "I was charged twice for my {service} this month, can you refund one of the payments?",
        "My latest bill is {amount} but my plan is supposed to cost much less.",
        "Why is there a late payment fee of {amount} on my invoice? I paid on {date}.",
        "Please explain the extra charges on my statement for account {acct}.",
        "The discount I was promised when I signed up has not been applied to my bill.",
        "I need a copy of my invoice from {date} for my expenses.",
        "You took {amount} by direct debit instead of the usual {amount2}.",
        "Can I get a refund for the days my {service} was not used? I was billed for the full month.",
        "There's a charge of {amount} on my bill that I don't understand.",
        "My payment of {amount} went through on {date} but the bill still says it's overdue.",
        "The price of my {service} went up without any notice, why am I paying more?",
        "I'd like to change the date my monthly payment is taken.",
        "Could you break down the {amount} you billed me? It doesn't match my contract.",
        "I was billed for roaming but I haven't left the country.",
        "Still waiting on the refund of {amount} that was promised on {date}.",
        "I keep getting charged a paper bill fee even though I chose e-billing.",
    ),
    "tech": (
        "My {service} keeps dropping every evening and I can't work from home.",
        "The {device} won't connect to the internet since {date}.",
        "{app} crashes every time I try to log in.",
        "My internet speed is really slow, nowhere near what I'm paying for.",
        "I have no signal on my phone at home anymore.",
        "The TV box shows an error code and there is no picture.",
        "Calls on my mobile cut out after a minute or so.",
        "I can't send text messages since the update, they just fail.",
        "My {device} restarts by itself several times a day.",
        "{app} won't load my statements, it just spins forever.",
        "Wifi is down again at {address}, the {device} lights are all red.",
        "Voicemail stopped working on my line {phone}.",
        "The internet connection has been unstable all week, can you send a technician?",
        "My new SIM card isn't being recognised by the phone.",
        "There's a crackling noise on the landline whenever I make a call.",
        "I get an error page when I try to pay by card on {app}, so the app seems broken.",
    ),
    "cancel": (
        "I want to cancel my {service} at the end of this month.",
        "Please close my account {acct}, I no longer need it.",
        "How do I end my contract early? I'm moving to {rival}.",
        "I'd like to cancel my subscription and not be renewed.",
        "Please terminate the line {phone} from {date}.",
        "I want to stop my {service} service, what do I need to do?",
        "Can you confirm the cancellation of my {service} that I requested on {date}?",
        "Cancel everything on my account please, I'm leaving.",
        "I'm switching to {rival} and want to cancel with you.",
        "Please don't renew my contract when it ends on {date}, I want to leave.",
        "I would like to close my savings account and move the money out.",
        "What is the fee to cancel my {service} before the contract ends?",
        "I need to cancel the {service} for my late father's account, {other_name}.",
        "Please end my membership, I don't use it anymore.",
    ),
    "fraud": (
        "There's a payment of {amount} on my {card} that I did not make.",
        "My {card} ending {card4} was stolen yesterday, please block it.",
        "I got a text asking for my PIN, I think it's a scam.",
        "Someone logged into my account from another country on {date}.",
        "I think my account has been hacked, my password was changed and it wasn't me.",
        "There are transactions on my statement I don't recognise, please investigate.",
        "I lost my wallet with my {card} in it, please freeze the card.",
        "A man called pretending to be from your bank and asked for my security code.",
        "Unauthorised transfer of {amount} from account {acct} this morning.",
        "I received a suspicious e-mail that looks like it's from you asking me to verify my details.",
        "My phone number was moved to a new SIM without my permission and now I can't get my codes.",
        "Someone opened a new phone contract in my name, I never signed anything.",
        "I clicked a link in a fake delivery text and entered my card details, what should I do?",
        "Several small payments I never authorised have gone out of my account since {date}.",
    ),
    "update": (
        "I've moved, please update my address to {address}.",
        "Please change the phone number on my account to {phone}.",
        "I need to update my e-mail address to {email}.",
        "I got married and my surname is now {last}, can you update my details?",
        "Can I add my partner {other_name} as an authorised user on the account?",
        "How do I change the password for {app}? I just want a new one.",
        "My contact number has changed, the new one is {phone}.",
        "Please update the name on the account, it's spelled wrong.",
        "I'd like to switch to paperless statements and have them sent to {email}.",
        "Can you update my date of birth on file? It shows the wrong year.",
        "I want to change the username I use to sign in to {app}.",
        "Please send letters to my new address, {address}, from now on.",
        "How do I change my security questions on my profile?",
        "I need to update my personal details after moving house on {date}.",
    ),
}

_INDIRECT: dict[str, tuple[str, ...]] = {
    "bill": (
        "The number on this month's statement is way higher than what I signed up for.",
        "Why am I paying for a premium package I never picked?",
        "I paid {amount} on {date} and your letter says I still owe it.",
        "Money left my account twice for the same month of {service}.",
        "Last month cost {amount} and this month {amount2}, and I used it exactly the same.",
        "Somebody promised me half price for a year and that lasted two months.",
    ),
    "tech": (
        "The little light on the {device} has been flashing orange since {date}.",
        "Every time I open {app} it goes white and closes.",
        "Video calls freeze every few minutes in the evening.",
        "Nothing loads on any of my devices at home, but my neighbours are fine.",
        "Since the storm on {date} the {device} just sits there blinking.",
        "People say my voice sounds robotic when I ring them.",
        "Pages take forever to open and films keep buffering.",
    ),
    "cancel": (
        "I'm moving abroad on {date} and won't need the {service} after that.",
        "Please make sure nothing renews after this month, I'm done.",
        "I've found a better deal elsewhere and would like to end things with you.",
        "After {date} I won't be needing any of your services, how do we wrap this up?",
        "My mother has gone into care, so her {service} can stop for good.",
        "I don't want to be a customer anymore, what are the steps?",
    ),
    "fraud": (
        "There's a payment of {amount} to a shop in a city I've never been to.",
        "I got a message asking me to confirm my PIN through a link, is that really you?",
        "My phone suddenly lost all service and then my password was reset, I did neither.",
        "Money went to a person called {other_name} and I have no idea who that is.",
        "My bag was taken on the train, my {card} was in it.",
        "Someone rang saying they were from your security team and wanted the code you just texted me.",
        "Purchases in another currency keep appearing on my {card} and I haven't travelled.",
    ),
    "update": (
        "I don't live at the old place anymore, post should go to {address}.",
        "My number is now {phone}, the old one is gone.",
        "Since my wedding I go by {last}, could your records say the same?",
        "The e-mail you have for me is one I can't open anymore, use {email} instead.",
        "Your letters still have my maiden name on them.",
        "My son {other_name} should also be allowed to speak to you about the account.",
    ),
}

# Hard cases: sentences that mention another label's topic but are not the request.
_NEGATIONS: dict[str, tuple[str, ...]] = {
    "bill": ("This isn't about my bill, the charges are fine.", "I'm not disputing any payment.",
                "Nothing is wrong with my billing,", "Not a billing question:"),
    "tech": ("The internet itself works fine.", "It's not a technical problem, everything works.",
                  "My {device} is working, that's not the issue."),
    "cancel": ("I'm not looking to cancel.", "I don't want to close my account,",
                     "Not cancelling anything,", "I am not leaving you,"),
    "fraud": ("This isn't fraud, I recognise all my payments.", "Nothing suspicious has happened,",
              "My card is not stolen,", "Not a scam report,"),
    "update": ("I don't need to change any of my details.", "My address and phone are the same as before,",
                "This isn't about updating my details,"),
}
_BACKGROUND: dict[str, tuple[str, ...]] = {
    "bill": ("I sorted my bill out with you last week, thanks for that.", "My bill is paid up to date.",
                "I had a refund from you on {date} which was fine.", "I pay {amount} a month by direct debit."),
    "tech": ("Last month my internet was down for a day but that's fixed now.",
                  "Your technician came on {date} and the {device} has worked since.",
                  "The app works fine for me otherwise."),
    "cancel": ("I almost cancelled last year.", "I've been with you for ten years and never wanted to leave.",
                     "A friend told me to just cancel but I'd rather sort it out."),
    "fraud": ("Last year my card was stolen and you handled it well.",
              "I reported a scam call on {date} and that was all sorted.",
              "I know you never ask for PINs, so I'm careful."),
    "update": ("I updated my address last year.", "I changed my e-mail a while ago to {email}.",
                "My details are all up to date."),
}
# A threat or aside that names another topic after the real request.
_ASIDES: dict[str, tuple[str, ...]] = {
    "cancel": ("If this isn't fixed soon I will cancel.", "Otherwise I'm going to close my account.",
                     "Sort it out or I'm switching to {rival}."),
    "bill": ("And I don't expect to pay for the days it didn't work.",),
    "tech": ("Your app is slow too but that's another story.",),
    "fraud": ("I'm not saying it's fraud, just want it explained.",),
    "update": ("Oh and my phone number is {phone} if you need it.",),
}
# Which asides may follow which intent (an aside must not be a second valid request).
_ASIDE_FOR = {
    "bill": ("cancel", "fraud"),
    "tech": ("cancel", "bill"),
    "fraud": ("update",),
    "update": ("tech",),
    "cancel": ("update",),
}

_GREETINGS = ("Hi,", "Hello,", "Good morning,", "Hey there,", "Dear support team,", "To whom it may concern,",
              "Hi there.", "Hello support,", "Evening,")
_INTROS = ("This is {name}.", "My name is {name} and my account number is {acct}.", "{name} here (account {acct}).",
           "I'm writing about account {acct}.", "It's {first} {last}, customer number {acct}.")
_CLOSINGS = ("Thanks.", "Thank you in advance!", "Please help asap.", "Cheers", "Appreciate it.",
             "Many thanks for your help.", "Kind regards.", "Please get back to me.", "thx")
_SIGNOFFS = ("- {name}", "Regards, {name}", "Call me on {phone}.", "You can reach me at {email}.",
             "{first}, {phone}", "Best, {name} ({email})")
_IDENTITY = ("My account number is {acct}.", "Account: {acct}", "Phone: {phone}", "- {name}")

_MISSPELLINGS = {
    "receive": "recieve", "account": "acount", "internet": "intenet", "payment": "payemnt",
    "cancel": "cancell", "definitely": "definately", "address": "adress", "because": "becuase",
    "statement": "statment", "please": "pls", "connection": "conection", "transaction": "transation",
}


@dataclass(frozen=True)
class _Style:
    """Generator settings for one split."""

    with_pii: bool
    hard_fraction: float
    typo_rate: float
    lowercase_rate: float
    framing_rate: float  # scales the chance of greetings, introductions, closings and sign-offs


def _typo(word: str, rng: random.Random) -> str:
    lower = word.lower()
    if lower in _MISSPELLINGS and word.islower():
        return _MISSPELLINGS[lower]
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(3)
    if kind == 0:  # swap two neighbours
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == 1:  # drop a letter
        return word[:i] + word[i + 1:]
    return word[:i] + word[i] + word[i:]  # double a letter


def _add_typos(template: str, rng: random.Random, n: int) -> str:
    """Misspell ``n`` plain words of a template (never a ``{slot}``, so no personal data is altered)."""
    tokens = template.split(" ")
    plain = [i for i, tok in enumerate(tokens) if tok.isalpha() and len(tok) >= 4]
    for i in rng.sample(plain, min(n, len(plain))):
        tokens[i] = _typo(tokens[i], rng)
    return " ".join(tokens)


def _other(label: str, rng: random.Random) -> str:
    return rng.choice([lab for lab in SUPPORT_LABELS if lab != label])


def _compose(label: str, rng: random.Random, style: _Style) -> str:
    """One message whose main request is ``label``."""
    filler = _SlotFiller(rng, style.with_pii)
    hard = rng.random() < style.hard_fraction
    hard_kind = rng.choice(("negation", "background", "indirect", "aside")) if hard else None

    request = rng.choice(_INDIRECT[label] if hard_kind == "indirect" else _DIRECT[label])
    if rng.random() < 0.2:  # a second sentence of the same intent makes longer messages
        request += " " + rng.choice([t for t in _DIRECT[label] + _INDIRECT[label] if t != request])
    if style.typo_rate and rng.random() < style.typo_rate:
        request = _add_typos(request, rng, rng.choice((1, 1, 2)))

    before: list[str] = []
    after: list[str] = []
    if hard_kind == "negation":
        before.append(rng.choice(_NEGATIONS[_other(label, rng)]))
    elif hard_kind == "background":
        before.append(rng.choice(_BACKGROUND[_other(label, rng)]))
    elif hard_kind == "aside":
        after.append(rng.choice(_ASIDES[rng.choice(_ASIDE_FOR[label])]))
    elif hard_kind == "indirect" and rng.random() < 0.3:
        before.append(rng.choice(_BACKGROUND[_other(label, rng)]))

    parts: list[str] = []
    framing = style.framing_rate
    if rng.random() < 0.55 * framing:
        parts.append(rng.choice(_GREETINGS))
    if rng.random() < 0.4 * framing:
        parts.append(rng.choice(_INTROS))
    parts += before + [request] + after
    if rng.random() < 0.5 * framing:
        parts.append(rng.choice(_CLOSINGS))
    if rng.random() < 0.35 * framing:
        parts.append(rng.choice(_SIGNOFFS))
    text = _join(parts).format_map(filler)
    if style.with_pii and not filler.used_pii:  # every private message identifies its sender somehow
        text += " " + rng.choice(_IDENTITY).format_map(filler)
    if rng.random() < style.lowercase_rate:
        text = text.lower()
    return re.sub(r"\s+", " ", text).strip()


def _join(parts: Sequence[str]) -> str:
    """Join sentences; after a trailing comma the next sentence continues in lower case."""
    out = ""
    for part in parts:
        if out.endswith(",") and part[:1].isupper() and not re.match(r"(I\b|I'|\{)", part):
            part = part[0].lower() + part[1:]
        out = f"{out} {part}" if out else part
    return out


def _balanced_labels(n: int, rng: random.Random) -> list[str]:
    labels = [SUPPORT_LABELS[i % len(SUPPORT_LABELS)] for i in range(n)]
    rng.shuffle(labels)
    return labels


def _generate(n: int, rng: random.Random, style: _Style, avoid: set[str]) -> list[Example]:
    """``n`` examples with labels balanced to within one, no text repeated across splits."""
    examples: list[Example] = []
    for label in _balanced_labels(n, rng):
        for _ in range(50):
            text = _compose(label, rng, style)
            if text not in avoid:
                break
        avoid.add(text)
        examples.append(Example(text=text, label=label))
    return examples


def generate_support_examples(n: int, seed: int, *, public: bool = False,
                              hard_fraction: float = DEFAULT_HARD_FRACTION) -> list[Example]:
    """Support messages without building a task (``public=True``: placeholders, no personal data)."""
    style = _public_style(hard_fraction) if public else _private_style(hard_fraction)
    return _generate(n, random.Random(seed), style, set())


def _private_style(hard_fraction: float) -> _Style:
    return _Style(with_pii=True, hard_fraction=hard_fraction, typo_rate=0.25, lowercase_rate=0.12,
                  framing_rate=1.0)


def _public_style(hard_fraction: float) -> _Style:
    # Public records are curated: placeholders instead of personal data, rare typos, and
    # mostly just the request (short demonstrations suit a small model's context).
    return _Style(with_pii=False, hard_fraction=hard_fraction, typo_rate=0.05, lowercase_rate=0.0,
                  framing_rate=0.2)


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def make_support_task(seed: int = 0, n_private: int = 600, n_public: int = 40, n_test: int = 200,
                      score_kind: ScoreKind = "accuracy", *,
                      hard_fraction: float = DEFAULT_HARD_FRACTION) -> ClassificationTask:
    """The built-in private customer-support task (5 intents, fake personal data).

    ``seed`` fixes every split. The private split goes into a ``PrivateDataset``;
    the public split (placeholders instead of personal data) may be shown to the
    mutation LLM and used as few-shot demonstrations; the test split has the same
    distribution as the private one and is for research evaluation only.
    ``hard_fraction`` is the share of messages built to defeat keyword matching.
    """
    _check_count("seed", seed, 0)
    _check_count("n_private", n_private, 1)
    _check_count("n_public", n_public, 0)
    _check_count("n_test", n_test, 1)
    if not 0.0 <= float(hard_fraction) <= 1.0:
        raise ValueError(f"hard_fraction: must be in [0, 1], got {hard_fraction!r}")
    # Independent streams per split, so changing n_test does not change the private records.
    private_seed, public_seed, test_seed = (
        int(s.generate_state(1)[0]) for s in np.random.SeedSequence(int(seed)).spawn(3)
    )
    seen: set[str] = set()
    private = _generate(n_private, random.Random(private_seed), _private_style(hard_fraction), seen)
    public = _generate(n_public, random.Random(public_seed), _public_style(hard_fraction), seen)
    test = _generate(n_test, random.Random(test_seed), _private_style(hard_fraction), seen)
    return ClassificationTask(
        name="support",
        description=SUPPORT_DESCRIPTION,
        labels=list(SUPPORT_LABELS),
        private_train=PrivateDataset(private),
        test=test,
        public_examples=public,
        verbalizers={label: " " + label for label in SUPPORT_LABELS},
        record_template=SUPPORT_RECORD_TEMPLATE,
        score_kind=score_kind,
        clip_bound=1.0,
        seed_prompt=SUPPORT_SEED_PROMPT,
    )


# ----------------------------------------------------------------------------------
# Prompts built from public text only (safe to print, to optimise from, to put in docs).
SUPPORT_REFERENCE_INSTRUCTION = "Sort each customer message into one category: bill, tech, cancel, fraud, update."

# Hand-written demonstrations (placeholders, no personal data), in a fixed order. The
# small model copies the label of the last demonstrations, so order matters: this one
# was chosen among 16 random orders/subsets of a 20-message pool (with or without the
# label list) by accuracy on the test split of seed 1, then checked on seeds 0 and 2
# (docs/tasks.md).
SUPPORT_REFERENCE_DEMOS: tuple[Example, ...] = (
    Example("Please send my statements to [email] from now on.", "update"),
    Example("I'm switching to another provider, how do I end my contract?", "cancel"),
    Example("There is a payment of [amount] on my card that I did not make.", "fraud"),
    Example("I'm not looking to cancel, but someone logged into my account from another country.", "fraud"),
    Example("The light on the router has been flashing orange since [date].", "tech"),
    Example("I've moved, please change my address to [address].", "update"),
    Example("I got married and my surname is now [last name].", "update"),
    Example("I'm moving abroad on [date] and won't need the line after that.", "cancel"),
    Example("My card ending [card digits] was stolen, please block it.", "fraud"),
    Example("The app crashes every time I try to log in.", "tech"),
    Example("This isn't about my bill, my phone has had no signal for two days.", "tech"),
    Example("I'm not saying it's fraud, I just don't understand the extra charge on my statement.", "bill"),
    Example("My new phone number is [phone].", "update"),
    Example("My broadband keeps dropping every evening.", "tech"),
    Example("Please cancel my TV package at the end of the month.", "cancel"),
)


def reference_prompt(task: ClassificationTask, *, with_label_list: bool = False) -> str:
    """The measured "good prompt" of the support task: 15 fixed public demonstrations.

    ``with_label_list`` puts ``SUPPORT_REFERENCE_INSTRUCTION`` (a label list) first; on
    Gemma 3 270M that scores lower (the model copies the listed words), see docs/tasks.md.
    """
    shots = "\n\n".join(task.render_demo(ex) for ex in SUPPORT_REFERENCE_DEMOS)
    return f"{SUPPORT_REFERENCE_INSTRUCTION}\n\n{shots}" if with_label_list else shots


def demo_prompt(task: ClassificationTask, n_demos: int, instruction: str = "") -> str:
    """``instruction`` plus ``n_demos`` of the task's public examples, spread evenly over the labels."""
    demos = _spread_over_labels(task.public_examples, task.labels, n_demos)
    parts = [instruction.strip()] if instruction.strip() else []
    parts += [task.render_demo(ex) for ex in demos]
    return "\n\n".join(parts)


def _spread_over_labels(examples: Sequence[Example], labels: Sequence[str], n: int) -> list[Example]:
    """Up to ``n`` examples covering the labels evenly, kept in their original order.

    Keeping the (shuffled) public order avoids always ending on the same label, which
    small models would copy.
    """
    queues = {label: [i for i, ex in enumerate(examples) if ex.label == label] for label in labels}
    chosen: list[int] = []
    while len(chosen) < n and any(queues.values()):
        for label in labels:
            if queues[label] and len(chosen) < n:
                chosen.append(queues[label].pop(0))
    return [examples[i] for i in sorted(chosen)]
