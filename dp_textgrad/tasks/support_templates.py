"""Sentences the support messages are built from, per intent label.

A message is its request (``DIRECT_REQUESTS`` use the label's usual words,
``INDIRECT_REQUESTS`` avoid them) with optional framing around it (greetings,
introductions, closings, sign-offs). The hard cases, which point a keyword matcher
to the wrong label, add ``NEGATIONS`` or ``BACKGROUND`` of another topic before the
request, or an ``ASIDES`` threat after it. ``{slot}`` fields are filled by
``support_slots.SlotFiller``; no template holds personal data or digits.
"""

from __future__ import annotations

SUPPORT_LABELS: tuple[str, ...] = ("bill", "tech", "cancel", "fraud", "update")

# Requests. "direct" ones use the label's usual words; "indirect" ones avoid them.
DIRECT_REQUESTS: dict[str, tuple[str, ...]] = {
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

INDIRECT_REQUESTS: dict[str, tuple[str, ...]] = {
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
NEGATIONS: dict[str, tuple[str, ...]] = {
    "bill": (
        "This isn't about my bill, the charges are fine.",
        "I'm not disputing any payment.",
        "Nothing is wrong with my billing,",
        "Not a billing question:",
    ),
    "tech": (
        "The internet itself works fine.",
        "It's not a technical problem, everything works.",
        "My {device} is working, that's not the issue.",
    ),
    "cancel": (
        "I'm not looking to cancel.",
        "I don't want to close my account,",
        "Not cancelling anything,",
        "I am not leaving you,",
    ),
    "fraud": (
        "This isn't fraud, I recognise all my payments.",
        "Nothing suspicious has happened,",
        "My card is not stolen,",
        "Not a scam report,",
    ),
    "update": (
        "I don't need to change any of my details.",
        "My address and phone are the same as before,",
        "This isn't about updating my details,",
    ),
}
BACKGROUND: dict[str, tuple[str, ...]] = {
    "bill": (
        "I sorted my bill out with you last week, thanks for that.",
        "My bill is paid up to date.",
        "I had a refund from you on {date} which was fine.",
        "I pay {amount} a month by direct debit.",
    ),
    "tech": (
        "Last month my internet was down for a day but that's fixed now.",
        "Your technician came on {date} and the {device} has worked since.",
        "The app works fine for me otherwise.",
    ),
    "cancel": (
        "I almost cancelled last year.",
        "I've been with you for ten years and never wanted to leave.",
        "A friend told me to just cancel but I'd rather sort it out.",
    ),
    "fraud": (
        "Last year my card was stolen and you handled it well.",
        "I reported a scam call on {date} and that was all sorted.",
        "I know you never ask for PINs, so I'm careful.",
    ),
    "update": (
        "I updated my address last year.",
        "I changed my e-mail a while ago to {email}.",
        "My details are all up to date.",
    ),
}
# A threat or aside that names another topic after the real request.
ASIDES: dict[str, tuple[str, ...]] = {
    "cancel": (
        "If this isn't fixed soon I will cancel.",
        "Otherwise I'm going to close my account.",
        "Sort it out or I'm switching to {rival}.",
    ),
    "bill": ("And I don't expect to pay for the days it didn't work.",),
    "tech": ("Your app is slow too but that's another story.",),
    "fraud": ("I'm not saying it's fraud, just want it explained.",),
    "update": ("Oh and my phone number is {phone} if you need it.",),
}
# Which asides may follow which intent (an aside must not be a second valid request).
ASIDE_FOR = {
    "bill": ("cancel", "fraud"),
    "tech": ("cancel", "bill"),
    "fraud": ("update",),
    "update": ("tech",),
    "cancel": ("update",),
}

GREETINGS = (
    "Hi,",
    "Hello,",
    "Good morning,",
    "Hey there,",
    "Dear support team,",
    "To whom it may concern,",
    "Hi there.",
    "Hello support,",
    "Evening,",
)
INTROS = (
    "This is {name}.",
    "My name is {name} and my account number is {acct}.",
    "{name} here (account {acct}).",
    "I'm writing about account {acct}.",
    "It's {first} {last}, customer number {acct}.",
)
CLOSINGS = (
    "Thanks.",
    "Thank you in advance!",
    "Please help asap.",
    "Cheers",
    "Appreciate it.",
    "Many thanks for your help.",
    "Kind regards.",
    "Please get back to me.",
    "thx",
)
SIGNOFFS = (
    "- {name}",
    "Regards, {name}",
    "Call me on {phone}.",
    "You can reach me at {email}.",
    "{first}, {phone}",
    "Best, {name} ({email})",
)
IDENTITY_LINES = ("My account number is {acct}.", "Account: {acct}", "Phone: {phone}", "- {name}")

MISSPELLINGS = {
    "receive": "recieve",
    "account": "acount",
    "internet": "intenet",
    "payment": "payemnt",
    "cancel": "cancell",
    "definitely": "definately",
    "address": "adress",
    "because": "becuase",
    "statement": "statment",
    "please": "pls",
    "connection": "conection",
    "transaction": "transation",
}
