#!/usr/bin/env python3
"""Deterministic generator of synthetic support tickets for the demo job.

Running ``python scripts/make_samples.py`` (re)writes, under ``data/``:

* ``samples/tickets/tickets_part1.jsonl`` and ``samples/tickets/tickets_part2.jsonl``
  (2,000 lines in total by default, split 60/40 -> 1,200 + 800);
* ``samples/tickets_small/tickets.jsonl``: 40 clean rows, a subset of the above
  (and of the golden set, so their labels are known);
* ``golden/demo.jsonl``: 60 ``{"ticket_id", "subject", "body", "label"}`` rows with the true
  category of 60 valid, non-duplicated, normal-length tickets.

A ticket row looks like::

    {"ticket_id": "T000123", "customer": "...", "channel": "email|chat|phone",
     "created_at": "2026-10-07T09:14:33Z", "subject": "...", "body": "..."}

The true category (billing, bug, feature_request, account, other) is never in a
ticket row; it is only in the golden file.

Deliberate faults, at positions drawn from the seed and reported in the summary:

* ~3% duplicate rows: the body equals an *earlier* row's body after whitespace
  normalisation (``normalize_ws``: collapse every run of whitespace -- spaces,
  tabs, ``\\xa0``, ``\\u2028``, newlines -- into one space and strip the ends),
  but the raw body differs (double spaces, tabs, NBSPs, line separators, trailing
  newlines) and the ticket_id/created_at differ. customer, channel and subject are
  copied from the original, so any prompt built from these rows is identical.
* 9 malformed lines spread over both files: 3 truncated JSON objects, 2 rows
  without ``body``, 2 rows with an empty / whitespace-only body, 1 line with
  invalid UTF-8 bytes (the rest of that line is otherwise valid JSON), 1 row
  whose ``body`` is a number.
* 4 over-long rows (valid rows whose body is ~40,000 characters, ~10k tokens).

Ticket ids are ``T`` + the 1-based global line number (part1 first, then part2),
zero-padded to 6 digits, so every physical line -- including malformed ones --
has a unique id. ``created_at`` is non-decreasing in file order, within October
2026 (UTC). Files are written in binary mode with ``\\n`` line endings; JSON is
written with ``ensure_ascii=False`` (names and bodies contain non-ASCII text)
except that U+2028/U+2029 are always escaped, so no raw line separator ever
appears inside a line.

Only the standard library is used. ``generate(out_dir, n_rows, seed)`` is
importable; ``out_dir`` is the *data root* (the directory that receives
``samples/`` and ``golden/``), and the returned summary dict holds every path.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO_ROOT / "data"

CATEGORIES = ("billing", "bug", "feature_request", "account", "other")
CATEGORY_WEIGHTS = (25, 30, 15, 20, 10)
CHANNELS = ("email", "chat", "phone")
CHANNEL_WEIGHTS = (50, 35, 15)

PART_FILES = ("tickets_part1.jsonl", "tickets_part2.jsonl")
PART1_SHARE = 0.6
SMALL_FILE = "tickets.jsonl"
GOLDEN_FILE = "demo.jsonl"

BODY_MIN_CHARS = 150
BODY_MAX_CHARS = 900
DUPLICATE_RATE = 0.03
N_GOLDEN = 60
N_SMALL = 40
OVERLONG_MIN_CHARS = 39_000
OVERLONG_MAX_CHARS = 41_000
MIN_ROWS = 150

# Malformed lines per file, in the order their positions are assigned.
MALFORMED_PLAN = (
    ("broken_json", "missing_body", "empty_body", "invalid_utf8", "broken_json"),
    ("broken_json", "missing_body", "whitespace_body", "numeric_body"),
)
N_OVERLONG_PER_FILE = (2, 2)
OVERLONG_CATEGORIES = ("bug", "billing", "bug", "account")

INVALID_UTF8_PLACEHOLDER = "@@INVALID_UTF8@@"
# Latin-1 encoded text inside a UTF-8 file: 0xE9 followed by a space, 0xE7
# followed by 'u', and 0xFF are never valid UTF-8.
INVALID_UTF8_BYTES = b"Caf\xe9 Ol\xe9, re\xe7u le \xff\xfe re\xe7u"

PERIOD_START = datetime(2026, 10, 1, tzinfo=UTC)
PERIOD_SECONDS = 31 * 24 * 3600


def normalize_ws(text: str) -> str:
    """Collapse every run of whitespace (incl. tabs, NBSP, U+2028, newlines)."""
    return " ".join(text.split())


# --------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------

FIRST_NAMES = (
    "Ana",
    "Ben",
    "Chloé",
    "Daniel",
    "Elif",
    "Farah",
    "Giulia",
    "Hiroshi",
    "Ines",
    "Jonas",
    "Kwame",
    "Lena",
    "Mateo",
    "Nadia",
    "Oliver",
    "Priya",
    "Quentin",
    "Rosa",
    "Sven",
    "Tomás",
    "Uma",
    "Victor",
    "Wen",
    "Ximena",
    "Yusuf",
    "Zoë",
    "Aisha",
    "Björn",
    "Carlos",
    "Dmitri",
    "Emma",
    "Fatima",
    "Gareth",
    "Hana",
    "Ivan",
    "Julia",
    "Kenji",
    "Laura",
    "Marek",
    "Noor",
    "Olga",
    "Pedro",
    "Rahul",
    "Sofia",
    "Thabo",
    "Łukasz",
    "Mei",
    "Niamh",
    "Omar",
    "Pauline",
)
LAST_NAMES = (
    "Souza",
    "Okafor",
    "Müller",
    "Tanaka",
    "Kowalski",
    "Nguyen",
    "García",
    "Smith",
    "Rossi",
    "Haddad",
    "Larsen",
    "Petrov",
    "Dubois",
    "Chen",
    "Patel",
    "O'Brien",
    "Schmidt",
    "Yılmaz",
    "Santos",
    "Kim",
    "Andersson",
    "Mensah",
    "Novak",
    "Fischer",
    "Ibrahim",
    "Moreau",
    "Costa",
    "Ivanova",
    "Hughes",
    "Sato",
    "Jensen",
    "Alvarez",
)
COMPANIES = (
    "Northwind Traders",
    "Acme Logistics",
    "Bluefin Analytics",
    "Cedar & Co",
    "Driftwood Studio",
    "Everpeak Health",
    "Foxglove Retail",
    "Granite Labs",
    "Harbor Legal",
    "Ironleaf Foods",
    "Juniper Schools",
    "Kestrel Media",
    "Lumen Architects",
    "Meridian Travel",
    "Nimbus Robotics",
    "Orchard Dental",
)

PLANS = ("Starter", "Team", "Pro", "Business", "Enterprise")
MONTHS = ("August", "September", "October")
CURRENCIES = ("USD", "EUR", "GBP")
DEVICES = (
    "an iPhone 15",
    "a Pixel 8",
    "a Samsung Galaxy S23",
    "an iPad Air",
    "a MacBook Pro",
    "a Windows 11 laptop",
    "a Chromebook",
    "an Ubuntu desktop",
)
BROWSERS = ("Chrome", "Firefox", "Safari", "Edge", "Brave")
APP_VERSIONS = ("4.12.0", "4.12.1", "4.13.0", "4.13.2", "5.0.0-beta.3", "4.11.7")
APP_AREAS = (
    "the reports page",
    "the dashboard",
    "the CSV export",
    "the invoice editor",
    "the calendar view",
    "the file uploader",
    "the search bar",
    "the mobile app",
    "the team inbox",
    "the settings screen",
    "the PDF preview",
    "the import wizard",
)
INTEGRATIONS = (
    "Slack",
    "Salesforce",
    "HubSpot",
    "Zapier",
    "Google Sheets",
    "Jira",
    "QuickBooks",
    "Xero",
    "Microsoft Teams",
    "Shopify",
    "Notion",
    "Zendesk",
)
FEATURES = (
    "a dark mode",
    "bulk editing of records",
    "custom fields on contacts",
    "scheduled report emails",
    "an API endpoint for attachments",
    "keyboard shortcuts",
    "recurring invoices",
    "a read-only guest role",
    "two-way calendar sync",
    "saved search filters",
    "an audit log export",
    "multi-currency price lists",
    "webhooks for status changes",
    "a Gantt view for projects",
    "offline mode in the mobile app",
    "single sign-on with Okta",
    "per-user time zones",
    "tags on attachments",
)
ERROR_CODES = (
    "ERR_500",
    "E1042",
    "SYNC_TIMEOUT",
    "0x80070005",
    "HTTP 502",
    "E_QUOTA_EXCEEDED",
    "ERR_UPLOAD_ABORTED",
    "TOKEN_INVALID",
    "HTTP 429",
    "E2203",
)
# (subject, sentence) pairs for the "other" category.
OTHER_TOPICS = (
    ("Partnership inquiry", "we run a small consultancy and would like to explore a reseller partnership"),
    ("Press inquiry", "I am writing an article about remote-work tools and would love a short quote"),
    ("Just a thank you", "I just wanted to say the new onboarding flow is fantastic"),
    ("Meetup sponsorship", "we are organising a local meetup and wondered whether you sponsor community events"),
    ("Security questionnaire", "our procurement team needs a completed security questionnaire before we can proceed"),
    ("Job application question", "I saw a job posting for a support engineer and could not find where to apply"),
    ("Support hours on holidays?", "I could not find your support hours for public holidays anywhere"),
    ("Where is our data hosted?", "our legal team asked in which region our data is hosted"),
    ("Stickers?", "a colleague mentioned you send stickers to community members"),
    (
        "Using the product in a classroom",
        "I teach a course on small-business operations and want to use your product in class",
    ),
)


# --------------------------------------------------------------------------
# Templates: every fragment is a format string; slots are filled from `ctx`.
# --------------------------------------------------------------------------

GREETINGS = (
    "Hi team,",
    "Hello,",
    "Hi there,",
    "Good morning,",
    "Dear support,",
    "Hello support team,",
    "Hey folks,",
    "Good afternoon,",
)
CHAT_OPENERS = ("hey, ", "hi! ", "hello - ", "hi, quick one: ", "", "")
CLOSINGS = (
    "Thanks in advance.",
    "Thank you for your help.",
    "Looking forward to hearing from you.",
    "Appreciate any help.",
    "Let me know if you need anything else from me.",
    "Thanks for looking into it.",
    "",
)
SIGNOFFS = ("Best,", "Thanks,", "Regards,", "Cheers,", "Kind regards,", "Many thanks,")
CONTEXTS = (
    "We are a team of {team_size} people on the {plan} plan.",
    "I am the account admin for {company}.",
    "We have been customers for about {years} years.",
    "I manage the workspace for {company} ({team_size} seats).",
    "Our company, {company}, relies on this every day.",
    "This is for the {company} workspace.",
)
URGENCY = (
    "This is fairly urgent for us.",
    "No rush, but I would like to get this sorted this week.",
    "Our month-end close depends on this.",
    "It is blocking my team right now.",
    "Whenever you get a chance is fine.",
)

# Generic subjects, used for ~25% of tickets regardless of the opening sentence.
GENERIC_SUBJECTS: dict[str, tuple[str, ...]] = {
    "billing": ("Billing question", "Question about my invoice", "Payment issue", "Re: billing"),
    "bug": ("Problem with the app", "Something is broken", "Error in {area}", "Help - not working"),
    "feature_request": ("Feature request", "Product feedback", "Suggestion", "Idea for the {plan} plan"),
    "account": ("Account help", "Access problem", "Account question", "Urgent: account"),
    "other": ("Question", "Hello", "Quick question from {company}", "General inquiry"),
}

# Opening statement of the problem/request (first person), each paired with the
# subjects that fit it.
INTROS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "billing": (
        (
            "I was charged twice for the {plan} plan in {month}: two payments of {amount} on the same day.",
            ("Charged twice in {month}", "Double charge on my card", "Duplicate payment {amount}"),
        ),
        (
            "Our latest invoice ({invoice}) shows {amount}, but our plan should cost less than that.",
            ("Wrong amount on invoice {invoice}", "Invoice {invoice} looks too high"),
        ),
        (
            "I downgraded from {plan} last month, yet the card on file was still billed {amount}.",
            ("Proration after downgrade", "Still billed after downgrading from {plan}"),
        ),
        (
            "We need a refund for invoice {invoice}; we cancelled before the renewal date.",
            ("Refund request for invoice {invoice}", "Refund after cancellation"),
        ),
        (
            "The invoice {invoice} is missing our VAT number, so our accountant cannot book it.",
            ("VAT missing from invoice", "Please add our VAT number to {invoice}"),
        ),
        (
            "Our card was declined on renewal and I am not sure whether the {plan} subscription is still active.",
            ("Card declined but plan still active?", "Renewal payment failed"),
        ),
        (
            "I see a charge of {amount} from you on my statement that I do not recognise.",
            ("Billing: unexpected charge of {amount}", "Unknown charge on my statement"),
        ),
        (
            "The invoices for {month} were issued in {currency} but our account is set up in a different currency.",
            ("Invoice currency is wrong", "Invoices in {currency} instead of our currency"),
        ),
        (
            "I cannot find the receipt for the {month} payment of {amount} anywhere in the billing page.",
            ("Need a receipt for {month}", "Where can I download receipts?"),
        ),
        (
            "We were billed for {seats} seats even though only {team_size} people use the account.",
            ("Billed for {seats} seats", "Seat count on our invoice is wrong"),
        ),
    ),
    "bug": (
        (
            "Since this morning {area} does not load at all; it just spins forever.",
            ("{area_title} not loading", "{area_title} stuck on loading spinner"),
        ),
        (
            "Every time I try to use {area} I get the error {error}.",
            ("Error {error} in {area}", "Getting {error} constantly"),
        ),
        (
            "The app crashes as soon as I open {area} on {device}.",
            ("App crashes on {device_short}", "Crash when opening {area}"),
        ),
        (
            "The sync with {integration} stopped working after the update to version {version}.",
            ("Sync with {integration} broken", "{integration} sync stopped after {version}"),
        ),
        (
            "When I export from {area}, the file is empty even though there is data on screen.",
            ("Export produces empty file", "Empty export from {area}"),
        ),
        (
            "Uploading a file larger than {size} MB fails with {error} at around 90%.",
            ("Upload fails with {error}", "Large uploads failing"),
        ),
        (
            "Notifications for new messages stopped arriving on {device} about {days} days ago.",
            ("Notifications stopped working", "No push notifications on {device_short}"),
        ),
        (
            "Dates in {area} are shown one day off, as if the time zone is ignored.",
            ("Wrong dates shown in {area}", "Time zone bug in {area}"),
        ),
        (
            "In {browser}, {area} freezes for several seconds after every click.",
            ("Page freezes in {browser}", "{area_title} very slow in {browser}"),
        ),
        (
            "After updating to {version}, {area} shows a blank white page.",
            ("Bug: {area} shows blank page", "Something broke after update {version}"),
        ),
    ),
    "feature_request": (
        (
            "It would be great if you could add {feature}.",
            ("Feature request: {feature_short}", "Please add {feature_short}"),
        ),
        ("Our team would really benefit from {feature}.", ("Would love {feature}", "Request: {feature_short}")),
        (
            "Have you considered adding {feature}? We ask ourselves this every week.",
            ("Any plans for {feature}?", "{feature_short_cap} - on the roadmap?"),
        ),
        (
            "One thing we miss compared to other tools is {feature}.",
            ("Missing feature: {feature_short}", "Missing: {feature_short}"),
        ),
        (
            "I would like to suggest {feature} for a future release.",
            ("Suggestion: {feature_short}", "Feature suggestion"),
        ),
        (
            "Could you please put {feature} on the roadmap?",
            ("Roadmap request: {feature_short}", "Feature request: {feature_short}"),
        ),
        (
            "We love the product, but {feature} would make it much better for us.",
            ("Product feedback - {feature_short}", "Love it, one wish: {feature_short}"),
        ),
        ("A small wish from our side: {feature}.", ("Small wish: {feature_short}", "Wishlist item")),
    ),
    "account": (
        (
            "I cannot log in anymore; the page says my credentials are invalid even after a reset.",
            ("Can't log in", "Login not working"),
        ),
        (
            "I requested a password reset {n} times but the email never arrives, not even in spam.",
            ("Password reset email not arriving", "No reset email"),
        ),
        (
            "I lost the phone with my authenticator app and now I cannot pass two-factor authentication.",
            ("Lost my 2FA device", "Locked out by two-factor authentication"),
        ),
        (
            "I need to change the email address on my account to my new work address.",
            ("Change account email address", "Update my login email"),
        ),
        (
            "Please delete my account and all personal data associated with it.",
            ("Please delete my account", "Account deletion request"),
        ),
        (
            "Our previous admin left {company} and we need to transfer ownership of the workspace to me.",
            ("Transfer workspace ownership", "New owner for {company} workspace"),
        ),
        (
            "My account got locked after too many login attempts and the unlock link has expired.",
            ("Account locked after too many attempts", "Unlock link expired"),
        ),
        (
            "I accidentally created two accounts and would like to merge them into one.",
            ("Merge two accounts", "Duplicate accounts"),
        ),
        (
            "I need to add a second administrator to the {company} workspace but the option is greyed out.",
            ("Add a new admin to {company}", "Cannot add second admin"),
        ),
        (
            "The name on our account is still the old company name and I cannot edit it myself.",
            ("Update company name on account", "Rename our account"),
        ),
    ),
    "other": (
        ("{topic_sentence}.", ("{topic_subject}",)),
        ("Not a support issue as such: {topic_sentence_lc}.", ("{topic_subject}",)),
        ("Hope this is the right address - {topic_sentence_lc}.", ("{topic_subject}",)),
        ("Quick non-technical question: {topic_sentence_lc}.", ("{topic_subject}",)),
    ),
}

# Extra detail sentences (1-3 are used).
DETAILS: dict[str, tuple[str, ...]] = {
    "billing": (
        "The payment reference on my bank statement is {ref}.",
        "Our finance team needs this corrected before the end of the month.",
        "I checked the billing page and it only lists one subscription.",
        "We are on annual billing, so the monthly charge is confusing.",
        "The card ending in {last4} is the one that was charged.",
        "I have attached a screenshot of the bank statement.",
        "Could you also confirm what we will be charged next month?",
        "The amount does not match the price listed on your website.",
        "We changed our billing address in {month}, which may be related.",
        "Our purchase order number is {po}.",
    ),
    "bug": (
        "I am using {browser} on {device}.",
        "I already tried clearing the cache and logging out and back in.",
        "It happens for all of my colleagues too, not just me.",
        "The console shows {error} right before it fails.",
        "It worked fine until {days} days ago.",
        "Steps: open {area}, pick any record, click save - the error appears.",
        "Reinstalling the app did not help.",
        "Sometimes it works on the second or third try.",
        "Our app version is {version}.",
        "I can send a screen recording if that helps.",
        "The request id shown in the error dialog is {ref}.",
    ),
    "feature_request": (
        "Right now we work around it with spreadsheets, which is error-prone.",
        "About {team_size} people on our team would use this daily.",
        "{integration} already supports something similar, for reference.",
        "Even a basic first version would help us a lot.",
        "We would happily test a beta version.",
        "It is the most common request I hear from my colleagues.",
        "This would save us roughly {hours} hours a week.",
        "We are on the {plan} plan and would consider upgrading for this.",
        "Ideally it would also be available through the API.",
    ),
    "account": (
        "My username is {email}.",
        "I can verify my identity with the last four digits of the card on file ({last4}).",
        "I have access to the recovery codes, but they are also rejected.",
        "This is the only admin account for our workspace.",
        "The old email address no longer exists, so I cannot confirm from there.",
        "I tried from two different browsers with the same result.",
        "Please let me know what information you need to verify me.",
        "Other members of the team can still log in normally.",
        "The workspace ID shown in the URL is {ref}.",
    ),
    "other": (
        "There is no rush at all.",
        "Happy to jump on a call if that is easier.",
        "I could not find this information on your website.",
        "Please forward this to the right person if it is not you.",
        "Our organisation is based in {city}.",
        "We have been happy users for {years} years.",
        "You can reach me at {email}.",
    ),
}

ASKS: dict[str, tuple[str, ...]] = {
    "billing": (
        "Could you please refund the duplicate payment?",
        "Can you issue a corrected invoice?",
        "Please let me know how to get this fixed.",
        "Could you explain what this charge is for?",
        "Please cancel the extra charge and confirm by email.",
    ),
    "bug": (
        "Could you look into this?",
        "Is this a known issue, and is there a workaround?",
        "Please let me know when a fix is available.",
        "Can you check whether something is wrong on your side?",
        "Any idea what is causing this?",
    ),
    "feature_request": (
        "Is this something you are planning?",
        "Would love to hear if this is on the roadmap.",
        "Please pass this on to the product team.",
        "Let me know if you need more details about our use case.",
    ),
    "account": (
        "Can you help me regain access?",
        "Please let me know the next steps.",
        "Could you make this change for me?",
        "How do I proceed from here?",
        "Can you confirm once this is done?",
    ),
    "other": (
        "Who would be the right person to talk to?",
        "Could you point me in the right direction?",
        "Let me know what you think.",
        "Any information would be appreciated.",
    ),
}

CITIES = ("Lisbon", "Nairobi", "Toronto", "Osaka", "Kraków", "Austin", "Leeds", "Bogotá", "Pune", "Oslo")

LOG_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
LOG_COMPONENTS = ("sync-worker", "export-svc", "api-gw", "uploader", "scheduler", "auth")
LOG_MESSAGES = (
    "request to /api/v2/exports failed: upstream timeout after 30000ms",
    "retrying job {ref} (attempt {n}/5)",
    "received {size}MB payload, streaming to storage",
    "connection reset by peer while reading response body",
    "token refresh failed: {error}",
    "cache miss for workspace {ref}, falling back to primary",
    "rate limited by {integration} API, backing off {n}s",
    "worker heartbeat ok, queue depth {seats}",
    "unhandled exception in handler: KeyError('record_id')",
    "sync batch committed: {seats} records",
)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def _weighted(rng: random.Random, items: tuple, weights: tuple) -> Any:
    return rng.choices(items, weights=weights, k=1)[0]


def _make_ctx(rng: random.Random, customer: str, company: str) -> dict[str, str]:
    area = rng.choice(APP_AREAS)
    feature = rng.choice(FEATURES)
    device = rng.choice(DEVICES)
    topic = rng.choice(OTHER_TOPICS)
    first = customer.split()[0]
    local = "".join(ch for ch in customer.lower().replace(" ", ".") if ch.isascii() and (ch.isalnum() or ch == "."))
    domain = "".join(ch for ch in company.lower() if ch.isalnum()) + ".example"
    return {
        "plan": rng.choice(PLANS),
        "month": rng.choice(MONTHS),
        "currency": rng.choice(CURRENCIES),
        "amount": f"{rng.choice(('$', '€', '£'))}{rng.randint(9, 2400)}.{rng.randint(0, 99):02d}",
        "invoice": f"INV-{rng.randint(2024, 2026)}-{rng.randint(1000, 99999):05d}",
        "seats": str(rng.randint(5, 250)),
        "team_size": str(rng.randint(2, 60)),
        "years": str(rng.randint(2, 9)),
        "company": company,
        "area": area,
        "area_title": area.replace("the ", "", 1).capitalize(),
        "error": rng.choice(ERROR_CODES),
        "device": device,
        "device_short": device.split(" ", 1)[1],
        "browser": rng.choice(BROWSERS),
        "version": rng.choice(APP_VERSIONS),
        "integration": rng.choice(INTEGRATIONS),
        "size": str(rng.choice((5, 10, 25, 50, 100, 250))),
        "days": str(rng.randint(2, 14)),
        "n": str(rng.randint(2, 6)),
        "hours": str(rng.randint(2, 15)),
        "feature": feature,
        "feature_short": feature.removeprefix("a ").removeprefix("an "),
        "feature_short_cap": feature.removeprefix("a ").removeprefix("an ").capitalize(),
        "topic_subject": topic[0],
        "topic_sentence": topic[1][0].upper() + topic[1][1:],
        "topic_sentence_lc": topic[1],
        "ref": f"{rng.getrandbits(32):08x}",
        "last4": f"{rng.randint(0, 9999):04d}",
        "po": f"PO-{rng.randint(10000, 99999)}",
        "email": f"{local}@{domain}",
        "city": rng.choice(CITIES),
        "first": first,
    }


def _fill(template: str, ctx: dict[str, str]) -> str:
    return template.format(**ctx)


def _pick_intro(rng: random.Random, category: str, ctx: dict[str, str]) -> tuple[str, str]:
    """(opening sentence, matching subject)."""
    intro, subjects = rng.choice(INTROS[category])
    pool = GENERIC_SUBJECTS[category] if rng.random() < 0.25 else subjects
    return _fill(intro, ctx), _fill(rng.choice(pool), ctx)


def _compose_body(rng: random.Random, category: str, channel: str, ctx: dict[str, str]) -> tuple[str, str, str]:
    """(body of BODY_MIN_CHARS..BODY_MAX_CHARS characters, subject, opening sentence)."""
    intro, subject = _pick_intro(rng, category, ctx)
    n_details = rng.choice((1, 2, 2, 3, 3, 4, 5, 6, 7))
    details = rng.sample(DETAILS[category], k=min(n_details, len(DETAILS[category])))
    core: list[str] = [intro]
    if rng.random() < 0.4:
        core.insert(0 if rng.random() < 0.5 else 1, _fill(rng.choice(CONTEXTS), ctx))
    core.extend(_fill(d, ctx) for d in details)
    if category in ("billing", "bug", "account") and rng.random() < 0.3:
        core.append(rng.choice(URGENCY))
    core.append(rng.choice(ASKS[category]))
    spare = [_fill(d, ctx) for d in DETAILS[category] if _fill(d, ctx) not in core]
    rng.shuffle(spare)

    def render(sentences: list[str]) -> str:
        text = " ".join(sentences)
        if channel == "email":
            greeting = rng_greeting
            closing = f"{rng_closing}\n\n" if rng_closing else ""
            return f"{greeting}\n\n{text}\n\n{closing}{rng_signoff}\n{ctx['first']}"
        if channel == "chat":
            opener = rng_chat
            return opener + (text[0].lower() + text[1:] if opener else text)
        return f'[Phone call notes] Caller ({ctx["first"]}) said: "{text}" Agent promised a follow-up by email.'

    rng_greeting = rng.choice(GREETINGS)
    rng_closing = rng.choice(CLOSINGS)
    rng_signoff = rng.choice(SIGNOFFS)
    rng_chat = rng.choice(CHAT_OPENERS)

    body = render(core)
    while len(body) < BODY_MIN_CHARS and spare:
        core.insert(-1, spare.pop())
        body = render(core)
    while len(body) > BODY_MAX_CHARS and len(core) > 2:
        del core[-2]
        body = render(core)
    return body, subject, intro


def _overlong_body(rng: random.Random, category: str, ctx: dict[str, str], intro: str, target: int) -> str:
    """A ~40k-character body: a pasted log dump, transaction list or mail thread."""
    ts = PERIOD_START + timedelta(seconds=rng.randint(0, PERIOD_SECONDS // 2))
    if category == "bug":
        head = f"Hi team,\n\n{intro} I am pasting the full log from our side below, sorry it is long.\n\n"
        tail = "\n\nPlease let me know if you need anything else.\n" + ctx["first"]

        def gen_line() -> str:
            nonlocal ts
            ts += timedelta(milliseconds=rng.randint(3, 4000))
            sub = _make_ctx(rng, "X Y", ctx["company"])
            msg = _fill(rng.choice(LOG_MESSAGES), sub)
            return (
                f"{ts.strftime('%Y-%m-%dT%H:%M:%S')}.{ts.microsecond // 1000:03d}Z "
                f"{rng.choice(LOG_LEVELS):5s} [{rng.choice(LOG_COMPONENTS)}-{rng.randint(1, 8)}] {msg}"
            )
    elif category == "billing":
        head = f"Hello,\n\n{intro} Below is every transaction from our bank export so you can compare.\n\n"
        tail = "\n\nCan you tell me which of these are duplicates and refund them?\n" + ctx["first"]

        def gen_line() -> str:
            nonlocal ts
            ts += timedelta(hours=rng.randint(1, 30))
            return (
                f"{ts.strftime('%Y-%m-%d')} | card ****{rng.randint(0, 9999):04d} | "
                f"{rng.choice(('SUBSCRIPTION', 'SEAT ADD-ON', 'USAGE', 'TAX', 'REFUND'))} | "
                f"INV-2026-{rng.randint(1000, 99999):05d} | {rng.randint(1, 900)}.{rng.randint(0, 99):02d} "
                f"{rng.choice(CURRENCIES)} | ref {rng.getrandbits(40):010x}"
            )
    else:
        head = f"Hi,\n\n{intro} I am forwarding the whole thread with our IT department for context.\n\n"
        tail = "\n\nCan you please sort this out? We have been going back and forth for weeks.\n" + ctx["first"]

        def gen_line() -> str:
            nonlocal ts
            ts += timedelta(hours=rng.randint(1, 20))
            who = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
            sub = _make_ctx(rng, who, ctx["company"])
            text = " ".join(_fill(s, sub) for s in rng.sample(DETAILS[category], k=3))
            return f"> On {ts.strftime('%a %d %b %Y %H:%M')}, {who} wrote:\n> {text}\n"

    body_lines: list[str] = []
    size = len(head) + len(tail)
    while size < target:
        line = gen_line()
        body_lines.append(line)
        size += len(line) + 1
    return head + "\n".join(body_lines) + tail


_WS_MUTATIONS = ("double_space", "tab", "nbsp", "line_sep", "newlines", "flatten", "trailing", "leading")
_WS_RUN = re.compile(r"(\s+)")


def _whitespace_variant(rng: random.Random, body: str) -> str:
    """Same text as `body` after normalize_ws, but different raw whitespace.

    The original's layout (paragraph breaks) is mostly kept; a few separators are
    swapped for double spaces, tabs, NBSPs, U+2028, extra newlines, or flattened.
    """
    target = normalize_ws(body)
    parts = _WS_RUN.split(body.strip())
    words, orig_seps = parts[0::2], parts[1::2]
    for _ in range(100):
        seps = list(orig_seps)
        kinds = rng.sample(_WS_MUTATIONS, k=rng.randint(2, 4))
        for kind in kinds:
            k = max(1, len(seps) // rng.randint(6, 20))
            for i in rng.sample(range(len(seps)), k=min(k, len(seps))):
                sep = seps[i]
                if kind == "double_space":
                    seps[i] = sep + " "
                elif kind == "tab":
                    seps[i] = rng.choice(("\t", " \t", "\t\t", sep + "\t"))
                elif kind == "nbsp":
                    seps[i] = rng.choice(("\xa0", " \xa0", "\xa0\xa0"))
                elif kind == "line_sep":
                    seps[i] = rng.choice(("\u2028", " \u2028 "))
                elif kind == "newlines" and words[i].endswith((".", "?", "!", ",")):
                    seps[i] = rng.choice(("\n", "\n\n", "\r\n", " \n", "\n\n\n"))
                elif kind == "flatten" and "\n" in sep:
                    seps[i] = " "
        raw = words[0] + "".join(sep + w for sep, w in zip(seps, words[1:]))
        if "leading" in kinds:
            raw = rng.choice((" ", "  ", "\t", "\n")) + raw
        if "trailing" in kinds or rng.random() < 0.5:
            raw += rng.choice(("\n", "\n\n", " ", " \n", "\t\n", "\xa0"))
        if raw != body and normalize_ws(raw) == target:
            return raw
    raise RuntimeError("could not build a whitespace variant")  # pragma: no cover


def _dumps(obj: dict[str, Any]) -> str:
    text = json.dumps(obj, ensure_ascii=False)
    # Never leave raw line/paragraph separators inside a JSONL line.
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _part_sizes(n_rows: int) -> tuple[int, int]:
    p1 = round(n_rows * PART1_SHARE)
    return p1, n_rows - p1


# --------------------------------------------------------------------------
# Main entry point
# --------------------------------------------------------------------------


def generate(out_dir: Path, n_rows: int = 2000, seed: int = 42) -> dict:
    """Generate the sample tickets, golden set and small set under `out_dir`.

    `out_dir` is the data root: files go to ``out_dir/samples/tickets/``,
    ``out_dir/samples/tickets_small/`` and ``out_dir/golden/``. `n_rows` is the
    total number of physical lines over both part files (incl. malformed,
    duplicate and over-long lines). Returns the summary dict (also JSON-safe).
    """
    if n_rows < MIN_ROWS:
        raise ValueError(f"n_rows must be >= {MIN_ROWS}, got {n_rows}")
    out_dir = Path(out_dir)
    rng = random.Random(seed)

    sizes = _part_sizes(n_rows)
    offsets = (0, sizes[0])
    n_dup = round(n_rows * DUPLICATE_RATE)

    # ---- special positions (global 0-based line indexes) -----------------
    special: dict[int, str] = {}
    for part, (size, off) in enumerate(zip(sizes, offsets)):
        kinds = list(MALFORMED_PLAN[part]) + ["over_long"] * N_OVERLONG_PER_FILE[part]
        # Never the first or last line of a file: keep the faults "inside".
        positions = rng.sample(range(off + 1, off + size - 1), k=len(kinds))
        for pos, kind in zip(positions, kinds):
            special[pos] = kind

    regular = [i for i in range(n_rows) if i not in special]
    # Duplicates never sit in the first 5% of lines so that earlier originals exist.
    dup_candidates = [i for i in regular if i >= max(20, n_rows // 20)]
    dup_positions = set(rng.sample(dup_candidates, k=n_dup))

    timestamps = sorted(rng.randrange(PERIOD_SECONDS) for _ in range(n_rows))

    seen_norm: set[str] = set()
    rows: list[dict[str, Any]] = []  # one record per physical line (see fields below)
    originals: list[int] = []  # indexes into `rows` of base rows usable as dup sources
    dup_count_of: dict[int, int] = {}
    duplicate_of: dict[str, str] = {}
    overlong_seq = 0

    def new_base(idx: int, category: str | None = None) -> dict[str, Any]:
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        customer = f"{first} {last}"
        company = rng.choice(COMPANIES)
        category = category or _weighted(rng, CATEGORIES, CATEGORY_WEIGHTS)
        channel = _weighted(rng, CHANNELS, CHANNEL_WEIGHTS)
        for _ in range(50):
            ctx = _make_ctx(rng, customer, company)
            body, subject, intro = _compose_body(rng, category, channel, ctx)
            norm = normalize_ws(body)
            if norm not in seen_norm and BODY_MIN_CHARS <= len(body) <= BODY_MAX_CHARS:
                break
        else:  # pragma: no cover - astronomically unlikely
            raise RuntimeError("could not build a unique body")
        seen_norm.add(norm)
        ticket = {
            "ticket_id": f"T{idx + 1:06d}",
            "customer": customer,
            "channel": channel,
            "created_at": (PERIOD_START + timedelta(seconds=timestamps[idx])).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "subject": subject,
            "body": body,
        }
        return {"ticket": ticket, "label": category, "kind": "valid", "ctx": ctx, "intro": intro}

    for idx in range(n_rows):
        kind = special.get(idx)
        if kind is None and idx not in dup_positions:
            rec = new_base(idx)
            originals.append(idx)
        elif kind is None:
            # Prefer originals that are not yet duplicated; ~20% get a second copy.
            pool = [o for o in originals if dup_count_of.get(o, 0) == 0]
            again = [o for o in originals if dup_count_of.get(o, 0) == 1]
            src = rng.choice(again) if again and rng.random() < 0.2 else rng.choice(pool)
            dup_count_of[src] = dup_count_of.get(src, 0) + 1
            src_rec = rows[src]
            t = dict(src_rec["ticket"])
            t["ticket_id"] = f"T{idx + 1:06d}"
            t["created_at"] = (PERIOD_START + timedelta(seconds=timestamps[idx])).strftime("%Y-%m-%dT%H:%M:%SZ")
            t["body"] = _whitespace_variant(rng, src_rec["ticket"]["body"])
            rec = {"ticket": t, "label": src_rec["label"], "kind": "duplicate"}
            duplicate_of[t["ticket_id"]] = src_rec["ticket"]["ticket_id"]
        elif kind == "over_long":
            category = OVERLONG_CATEGORIES[overlong_seq % len(OVERLONG_CATEGORIES)]
            overlong_seq += 1
            rec = new_base(idx, category)
            target = rng.randint(OVERLONG_MIN_CHARS, OVERLONG_MAX_CHARS)
            body = _overlong_body(rng, category, rec["ctx"], rec["intro"], target)
            seen_norm.add(normalize_ws(body))
            rec["ticket"]["body"] = body
            rec["kind"] = "over_long"
        else:
            rec = new_base(idx)
            rec["kind"] = kind
            t = rec["ticket"]
            if kind == "broken_json":
                full = _dumps(t)
                cut = rng.randint(int(len(full) * 0.3), int(len(full) * 0.9))
                rec["raw"] = full[:cut].rstrip("\\").encode("utf-8")
            elif kind == "missing_body":
                del t["body"]
            elif kind == "empty_body":
                t["body"] = ""
            elif kind == "whitespace_body":
                t["body"] = " \t\n\xa0 \n"
            elif kind == "numeric_body":
                t["body"] = rng.randint(10_000, 99_999)
            elif kind == "invalid_utf8":
                t["body"] = t["body"].rstrip() + " " + INVALID_UTF8_PLACEHOLDER
                rec["raw"] = (
                    _dumps(t).encode("utf-8").replace(INVALID_UTF8_PLACEHOLDER.encode("ascii"), INVALID_UTF8_BYTES)
                )
            else:  # pragma: no cover
                raise AssertionError(kind)
        rows.append(rec)

    # ---- write the part files -----------------------------------------
    tickets_dir = out_dir / "samples" / "tickets"
    small_dir = out_dir / "samples" / "tickets_small"
    golden_dir = out_dir / "golden"
    for d in (tickets_dir, small_dir, golden_dir):
        d.mkdir(parents=True, exist_ok=True)

    def raw_line(rec: dict[str, Any]) -> bytes:
        return rec.get("raw") or _dumps(rec["ticket"]).encode("utf-8")

    files_summary: dict[str, Any] = {}
    for part, name in enumerate(PART_FILES):
        chunk = rows[offsets[part] : offsets[part] + sizes[part]]
        path = tickets_dir / name
        with open(path, "wb") as fh:
            for rec in chunk:
                fh.write(raw_line(rec) + b"\n")
        malformed = [
            {"line": i + 1, "kind": rec["kind"], "ticket_id": rec["ticket"]["ticket_id"]}
            for i, rec in enumerate(chunk)
            if rec["kind"] not in ("valid", "duplicate", "over_long")
        ]
        files_summary[name] = {
            "path": str(path),
            "rows": len(chunk),
            "malformed": malformed,
            "malformed_lines": [m["line"] for m in malformed],
            "over_long_lines": [i + 1 for i, rec in enumerate(chunk) if rec["kind"] == "over_long"],
            "duplicate_lines": [i + 1 for i, rec in enumerate(chunk) if rec["kind"] == "duplicate"],
        }

    # ---- golden + small sets ------------------------------------------
    duplicated_sources = {rows[o]["ticket"]["ticket_id"] for o in dup_count_of}
    by_cat: dict[str, list[dict[str, Any]]] = {c: [] for c in CATEGORIES}
    for rec in rows:
        if rec["kind"] == "valid" and rec["ticket"]["ticket_id"] not in duplicated_sources:
            by_cat[rec["label"]].append(rec)
    for c in CATEGORIES:
        rng.shuffle(by_cat[c])

    def round_robin(limit: int, per_cat: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        picked: list[dict[str, Any]] = []
        cursors = {c: 0 for c in CATEGORIES}
        while len(picked) < limit and any(cursors[c] < len(per_cat[c]) for c in CATEGORIES):
            for c in CATEGORIES:
                if len(picked) < limit and cursors[c] < len(per_cat[c]):
                    picked.append(per_cat[c][cursors[c]])
                    cursors[c] += 1
        return picked

    golden = round_robin(N_GOLDEN, by_cat)
    # The small set is a subset of the golden set, balanced per category.
    golden_by_cat = {c: [r for r in golden if r["label"] == c] for c in CATEGORIES}
    small = round_robin(N_SMALL, golden_by_cat)

    def by_id(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(recs, key=lambda r: r["ticket"]["ticket_id"])

    golden_path = golden_dir / GOLDEN_FILE
    with open(golden_path, "wb") as fh:
        for rec in by_id(golden):
            t = rec["ticket"]
            fh.write(
                _dumps(
                    {"ticket_id": t["ticket_id"], "subject": t["subject"], "body": t["body"], "label": rec["label"]}
                ).encode("utf-8")
                + b"\n"
            )
    small_path = small_dir / SMALL_FILE
    with open(small_path, "wb") as fh:
        for rec in by_id(small):
            fh.write(_dumps(rec["ticket"]).encode("utf-8") + b"\n")

    # ---- summary --------------------------------------------------------
    n_malformed = sum(1 for r in rows if r["kind"] not in ("valid", "duplicate", "over_long"))
    valid = n_rows - n_malformed
    over_long = [r for r in rows if r["kind"] == "over_long"]

    def count_labels(recs: list[dict[str, Any]]) -> dict[str, int]:
        return {c: sum(1 for r in recs if r["label"] == c) for c in CATEGORIES}

    return {
        "seed": seed,
        "n_rows": n_rows,
        "out_dir": str(out_dir),
        "files": files_summary,
        "rows_per_file": {name: files_summary[name]["rows"] for name in PART_FILES},
        "malformed_lines": {name: files_summary[name]["malformed_lines"] for name in PART_FILES},
        "malformed_count": n_malformed,
        "valid_rows": valid,  # parseable, body is a non-blank string (incl. duplicates and over-long)
        "duplicates": len(duplicate_of),
        "duplicate_of": duplicate_of,  # duplicate ticket_id -> earlier original ticket_id
        "unique_bodies": valid - len(duplicate_of),  # distinct normalised bodies among valid rows
        "over_long_ticket_ids": [r["ticket"]["ticket_id"] for r in over_long],
        "over_long_chars": {r["ticket"]["ticket_id"]: len(r["ticket"]["body"]) for r in over_long},
        "labels_valid": count_labels([r for r in rows if r["kind"] in ("valid", "duplicate", "over_long")]),
        "golden": {"path": str(golden_path), "rows": len(golden), "labels": count_labels(golden)},
        "small": {
            "path": str(small_path),
            "rows": len(small),
            "labels": count_labels(small),
            "ticket_ids": [r["ticket"]["ticket_id"] for r in by_id(small)],
        },
    }


def format_summary(summary: dict) -> str:
    lines = [f"seed={summary['seed']} n_rows={summary['n_rows']} out_dir={summary['out_dir']}"]
    for name, info in summary["files"].items():
        lines.append(f"{name}: {info['rows']} rows")
        for m in info["malformed"]:
            lines.append(f"  malformed line {m['line']:>5}: {m['kind']} ({m['ticket_id']})")
        lines.append(f"  over-long lines: {info['over_long_lines']}")
    lines.append(f"malformed lines (1-based): {summary['malformed_lines']}")
    lines.append(
        f"valid rows: {summary['valid_rows']}  duplicates: {summary['duplicates']}  "
        f"unique bodies: {summary['unique_bodies']}"
    )
    cross = sum(
        1
        for d, o in summary["duplicate_of"].items()
        if (int(d[1:]) > summary["rows_per_file"][PART_FILES[0]])
        != (int(o[1:]) > summary["rows_per_file"][PART_FILES[0]])
    )
    lines.append(f"  of which cross-file duplicates: {cross}")
    lines.append(
        "over-long ticket ids: " + ", ".join(f"{tid} ({n} chars)" for tid, n in summary["over_long_chars"].items())
    )
    lines.append(f"labels (valid rows): {summary['labels_valid']}")
    lines.append(
        f"golden: {summary['golden']['rows']} rows {summary['golden']['labels']} -> {summary['golden']['path']}"
    )
    lines.append(f"small:  {summary['small']['rows']} rows {summary['small']['labels']} -> {summary['small']['path']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="data root that receives samples/ and golden/ (default: repo data/)",
    )
    parser.add_argument("--n-rows", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    summary = generate(args.out_dir, n_rows=args.n_rows, seed=args.seed)
    print(json.dumps(summary, indent=2, ensure_ascii=False) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
