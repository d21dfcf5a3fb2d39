"""Template slots of the support messages: fake personal data, placeholders, vocabulary.

Private and test messages get FAKE personal data (names, phone and account numbers,
e-mail and street addresses, dates, amounts, card digits, references) drawn from the
message's ``random.Random``; the public split gets placeholders such as ``[name]``
instead, so it holds no personal data at all. Other slots (``{service}``, ``{device}``,
...) take public, non-personal words.
"""

from __future__ import annotations

import random

# Fake personal data. Names avoid ordinary English words ("Bill", "Grace", "Chase")
# so tests can detect them with a regex.
FIRST_NAMES = (
    "Amara",
    "Bogdan",
    "Chiara",
    "Dmitri",
    "Elif",
    "Farouk",
    "Gunnar",
    "Hana",
    "Ishaan",
    "Jolene",
    "Kwame",
    "Lucia",
    "Mateo",
    "Nadia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosalind",
    "Sven",
    "Tomasz",
    "Ursula",
    "Vikram",
    "Weronika",
    "Ximena",
    "Yusuf",
    "Zofia",
    "Aiden",
    "Beatriz",
    "Connor",
    "Delphine",
    "Emeka",
    "Freya",
    "Gideon",
    "Hiroshi",
    "Ingrid",
    "Jasper",
    "Keiko",
    "Leandro",
    "Maeve",
    "Nikhil",
)
LAST_NAMES = (
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Kowalski",
    "Tanaka",
    "Haddad",
    "Fitzgerald",
    "Novak",
    "Ramirez",
    "Schneider",
    "Oyelaran",
    "Castellano",
    "Petrov",
    "Nakamura",
    "Brennan",
    "Achterberg",
    "Varga",
    "Quispe",
    "Sorensen",
    "Abernathy",
    "Rasmussen",
    "Teixeira",
    "Dubois",
    "Halloran",
    "Ivanova",
    "Jaramillo",
    "Kaczmarek",
    "Lachance",
    "Mwangi",
    "Nieminen",
    "Ortega",
    "Pellegrini",
    "Rautio",
    "Szabo",
    "Takahashi",
    "Udeh",
    "Valdivia",
    "Whitcombe",
)
_STREETS = (
    "Maple",
    "Harbour",
    "Elm",
    "Kingfisher",
    "Station",
    "Mill",
    "Orchard",
    "Quarry",
    "Willow",
    "Beacon",
    "Chestnut",
    "Foundry",
    "Heron",
    "Juniper",
)
_STREET_KINDS = ("Road", "Street", "Lane", "Avenue", "Close", "Drive", "Way", "Crescent")
_CITIES = ("Ashford", "Riverton", "Dunmore", "Lakeside", "Brampton", "Fairview", "Northgate", "Kelso")
_EMAIL_DOMAINS = ("example.com", "example.net", "example.org", "mail.example", "inbox.test")
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)

# Placeholders of the public split: same slots, no personal data.
PUBLIC_PLACEHOLDERS = {
    "name": "[name]",
    "first": "[first name]",
    "last": "[last name]",
    "phone": "[phone]",
    "acct": "[account number]",
    "email": "[email]",
    "address": "[address]",
    "date": "[date]",
    "date2": "[date]",
    "other_name": "[name]",
    "amount": "[amount]",
    "amount2": "[amount]",
    "card4": "[card digits]",
    "ref": "[reference]",
}
PII_SLOTS = frozenset(PUBLIC_PLACEHOLDERS)

# Public, non-personal vocabulary shared by every split.
VOCABULARY = {
    "service": (
        "internet",
        "broadband",
        "fibre connection",
        "mobile plan",
        "TV package",
        "landline",
        "phone contract",
        "streaming add-on",
        "home phone line",
    ),
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
        return rng.choice(
            (
                lambda: f"(555) 01{_digits(rng, 1)}-{_digits(rng, 4)}",
                lambda: f"+44 7700 900{_digits(rng, 3)}",
                lambda: f"07{_digits(rng, 3)} {_digits(rng, 6)}",
                lambda: f"555-{_digits(rng, 3)}-{_digits(rng, 4)}",
                lambda: f"+1 202 555 0{_digits(rng, 3)}",
            )
        )()
    if slot == "acct":
        return rng.choice(
            (
                lambda: _digits(rng, rng.choice((8, 10, 12))),
                lambda: f"AC-{_digits(rng, 7)}",
                lambda: f"{_digits(rng, 4)}-{_digits(rng, 4)}-{_digits(rng, 2)}",
            )
        )()
    if slot == "email":
        sep = rng.choice((".", "_", ""))
        return f"{first.lower()}{sep}{last.lower()}{rng.randrange(1, 99)}@{rng.choice(_EMAIL_DOMAINS)}"
    if slot == "address":
        return f"{rng.randrange(1, 240)} {rng.choice(_STREETS)} {rng.choice(_STREET_KINDS)}, {rng.choice(_CITIES)}"
    if slot in ("date", "date2"):
        day = rng.randrange(1, 29)
        return rng.choice(
            (
                lambda: f"{rng.choice(_MONTHS)} {day}",
                lambda: f"{day:02d}/{rng.randrange(1, 13):02d}/{rng.choice((2023, 2024, 2025))}",
                lambda: f"the {day}{'th' if 4 <= day <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th')}",
            )
        )()
    if slot in ("amount", "amount2"):
        currency = rng.choice(("$", "£", "€"))
        return f"{currency}{rng.randrange(5, 950)}.{_digits(rng, 2)}"
    if slot == "card4":
        return _digits(rng, 4)
    if slot == "ref":
        return f"#{rng.choice('ABCDEFGHKLMNPRTX')}{rng.choice('ABCDEFGHKLMNPRTX')}{_digits(rng, 5)}"
    raise KeyError(slot)


class SlotFiller(dict):
    """Fills ``{slot}`` fields for one message, keeping a slot's value fixed within it."""

    def __init__(self, rng: random.Random, with_pii: bool) -> None:
        super().__init__()
        self._rng = rng
        self._with_pii = with_pii
        self._person = (rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES))
        self.used_pii = False

    def __missing__(self, slot: str) -> str:
        if slot in VOCABULARY:
            return self._rng.choice(VOCABULARY[slot])  # may differ between sentences: that is fine
        if slot not in PII_SLOTS:
            raise KeyError(f"template slot {{{slot}}} is unknown")
        self.used_pii = True
        value = _fake_value(slot, self._rng, self._person) if self._with_pii else PUBLIC_PLACEHOLDERS[slot]
        self[slot] = value
        return value
