"""Write paczero/data/demo_support_replies.jsonl: the shipped prompt -> completion example set.

Customer messages to an online shop and the replies its support desk sends, written for this package
(nothing is taken from a dataset). Six requests (a late parcel, a refund, a damaged item, a new delivery
address, a cancellation, a password reset), each with several hand-written phrasings, filled from small
lists of order numbers, products, cities, days and made-up example.com addresses. Every reply follows
its request's house reply, with the order number, product, city or address of the message copied in,
and ends with the desk's signature: a pattern a model can learn from a few dozen examples.
Deterministic (seeded); run from the repository root: ``python scripts/make_demo_support.py``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "paczero" / "data" / "demo_support_replies.jsonl"
SIGNATURE = " - Northwind Support"

PRODUCTS = ["kettle", "desk lamp", "rain jacket", "phone case", "blender", "backpack", "teapot", "yoga mat",
            "headphones", "coffee grinder", "toaster", "wall clock"]
CITIES = ["Leeds", "Bristol", "Glasgow", "Cardiff", "York", "Belfast", "Norwich", "Exeter"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
NAMES = ["amira", "ben", "chloe", "dev", "elena", "farid", "grace", "hugo", "ines", "jonas", "kemi", "liam"]
DOMAINS = ["example.com", "example.org", "example.net"]

REQUESTS = {
    "late": (
        ["My order {order} still hasn't arrived.",
         "Where is order {order}? It has been {n} days.",
         "Order {order} was due on {day} and nothing came.",
         "Hi, any news on order {order}? Tracking has not moved for {n} days."],
        "Sorry that order {order} is late. I have asked the courier to trace it and will email you an update "
        "within 24 hours.",
    ),
    "refund": (
        ["I sent the {product} from order {order} back. When do I get my money?",
         "Still waiting for my refund for the {product} (order {order}).",
         "You received my returned {product} {n} days ago, order {order}. Where is the refund?"],
        "Thanks for returning the {product}. The refund for order {order} goes out within 5 working days.",
    ),
    "damaged": (
        ["The {product} in order {order} arrived broken.",
         "My {product} came cracked, order {order}.",
         "Order {order}: the box was crushed and the {product} does not work."],
        "Sorry the {product} arrived damaged. A free replacement for order {order} ships today; please keep "
        "the broken one.",
    ),
    "address": (
        ["Can you send order {order} to {city} instead?",
         "I moved to {city}. Please change the address for order {order}.",
         "Wrong address on order {order}, it should go to my flat in {city}."],
        "Done: order {order} will now be delivered to {city}. A new tracking link is on its way by email.",
    ),
    "cancel": (
        ["Please cancel order {order}, I picked the wrong {product}.",
         "I no longer need the {product}. Cancel order {order} please.",
         "Can I still cancel order {order}? I ordered the {product} twice."],
        "Order {order} is cancelled and you have not been charged. You can order the {product} again at "
        "any time.",
    ),
    "password": (
        ["I can't log in as {email} and the reset email never comes.",
         "Password reset is not working for my account, {email}.",
         "Locked out of my account ({email}) since {day}, please help.",
         "The reset link sent to {email} says it has expired."],
        "I have sent a new reset link to {email}; it works for one hour. If it does not arrive, please check "
        "your spam folder.",
    ),
}


def rows(n_per_request: int = 50, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out, seen = [], set()
    for name, (phrasings, reply) in REQUESTS.items():
        made = 0
        while made < n_per_request:
            slots = {"order": str(rng.randint(10000, 99999)), "product": rng.choice(PRODUCTS),
                     "city": rng.choice(CITIES), "day": rng.choice(DAYS), "n": str(rng.randint(3, 14)),
                     "email": f"{rng.choice(NAMES)}{rng.randint(1, 99)}@{rng.choice(DOMAINS)}"}
            message = rng.choice(phrasings).format(**slots)
            if message in seen:
                continue
            seen.add(message)
            out.append({"prompt": f"Customer: {message}\nAgent:",
                        "completion": " " + reply.format(**slots) + SIGNATURE, "request": name})
            made += 1
    rng.shuffle(out)
    for i, row in enumerate(out):  # one test row in five
        row["split"] = "test" if i % 5 == 0 else "train"
    return out


if __name__ == "__main__":
    data = rows()
    OUT.write_text("".join(json.dumps(r) + "\n" for r in data))
    print(f"wrote {len(data)} rows to {OUT}")
