"""The checker's request set: one deterministic list of request bodies (seeded).

`generate(seed)` returns a list of `Req` dicts:

  id        unique, "<category>/<n>" or "<category>/<golden name>"
  category  the family the request belongs to (the summary counts by it)
  method    "POST" (a few "GET")
  path      "/v1/systemone" unless stated
  headers   extra request headers (lower-case names); content-type is application/json unless given
  body      bytes, sent exactly
  tags      list of strings the deliberate-difference rules read (e.g. "nan_literal")

Stdlib only. The same seed gives byte-identical bodies in the same order.
"""
import base64
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
GOLDENS_0415 = os.path.join(REPO, "tests", "fixtures", "goldens-0.4.15")

DEFAULT_SEED = 20250415


def J(obj):
    return json.dumps(obj, ensure_ascii=False)


EN = "I was charged twice for invoice 4411, please refund it today."
DE = "Mein Konto wurde zweimal belastet, bitte erstatten Sie den Betrag"
STATES = {
    "en": EN,
    "en2": "The customer wants a refund because the order never arrived.",
    "en_short": "Hello",
    "de": DE,
    "fr": "Bonjour, je voudrais annuler mon abonnement, merci beaucoup pour votre aide.",
    "es": "El cliente quiere cancelar el pedido porque llegó tarde y no tiene el producto.",
    "pt_short": "Quero cancelar",
    "it": "Il pacco non è ancora arrivato, vorrei un rimborso per questo ordine.",
    "nl": "De bestelling is niet aangekomen en ik wil mijn geld terug van de winkel.",
    "pl": "Zamówienie nie dotarło, proszę o zwrot pieniędzy za przesyłkę",
    "tr": "Siparişim gelmedi, lütfen paramı iade edin.",
    "ru": "Привет, как дела? Мне нужна помощь с заказом номер 5521.",
    "zh": "我的订单还没有到，请帮我退款。",
    "ja": "請求書4411で二重に請求されました。本日中に返金してください。",
    "ko": "주문이 아직 도착하지 않았습니다. 환불해 주세요.",
    "ar": "لم يصل طلبي بعد، أرجو استرداد المبلغ.",
    "hi": "मेरा ऑर्डर अभी तक नहीं आया है, कृपया रिफंड करें।",
    "el": "Η παραγγελία μου δεν έφτασε ακόμα.",
    "he": "ההזמנה שלי עוד לא הגיעה.",
    "th": "คำสั่งซื้อของฉันยังไม่มาถึง",
    "mixed_ru_en": "Привет, как дела? I need help with my order number 5521",
    "mixed_en_ko": "Order 5521 주문 refund",
    "mixed_en_de": "Please help: mein Konto ist gesperrt und ich kann nicht bezahlen",
    "emoji": "Thanks!!! 😀👍 great service ✓ — café naïve résumé Straße",
    "digits": "12345",
    "ids": "see github.com/acme/shop and mail a@b.c about v1.2.3 please",
    "controls": "\tTabs\tand\nnewlines\r\nand    multiple   spaces.",
    "mask": "please refund [MASK] today <mask> [CLS] x [SEP]",
    "empty": "",
}
LONG_EN = ("the customer wrote again about the refund for invoice 4411 and the missing parcel "
           "which was promised for monday but never arrived at the warehouse ")
LONG_RU = "Привет, как дела? Мне нужна помощь с заказом номер 5521. "
LABELS = ["billing", "tech", "account", "shipping", "fraud", "spam", "sales", "legal", "privacy",
          "returns", "feedback", "other"]
DESCS = ["payment problems", "technical issue", "", None, "anything else", 0, 1.5, True,
         {"d": "nested", "w": 0.5}, ["a", 2], "Geld zurück", "技术问题"]


def q(t, ins, crit=None, **extra):
    d = {"type": t, "instructions": ins}
    if crit is not None:
        d["criteria"] = crit
    d.update(extra)
    return d


Q_CHOICE = q("choice", "Which queue should handle this?",
             {"billing": "payment problems", "tech": "technical issue", "other": "anything else"})
Q_SCORE = q("score", "How urgent is this?", ["not urgent", "somewhat urgent", "urgent", "critical"])
Q_NOUL = q("noul", "Does the customer ask for a refund?")


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.out = []
        self.counts = {}

    def add(self, category, body, tags=(), method="POST", path="/v1/systemone", headers=None):
        n = self.counts.get(category, 0)
        self.counts[category] = n + 1
        if isinstance(body, str):
            body = body.encode("utf-8")
        self.out.append({"id": "%s/%d" % (category, n), "category": category, "method": method, "path": path,
                         "headers": dict(headers or {}), "body": body, "tags": list(tags)})

    def addj(self, category, obj, tags=(), **kw):
        self.add(category, J(obj), tags, **kw)

    # ---------------------------------------------------------------- random pieces
    def choice_crit(self):
        r = self.r
        k = r.choice([1, 2, 2, 3, 3, 4, 5, 6, 8, 10, 11, 12])
        labels = r.sample(LABELS, k)
        form = r.random()
        if form < 0.4:
            return labels
        if form < 0.85:
            return {lab: r.choice(DESCS) for lab in labels}
        mixed = [r.choice([1, 2.5, True, "x", 0, -1, "1"]) for _ in range(k)]
        return mixed

    def score_crit(self):
        r = self.r
        k = r.choice([1, 2, 3, 4, 5, 6, 8, 11])
        pool = ["low", "medium", "high", "critical", "", "none", 0, 1.5, {"d": "x"}, ["a"], True]
        return [r.choice(pool) if r.random() < 0.3 else "level %d" % i for i in range(k)]

    def question(self):
        r = self.r
        t = r.choice(["choice", "choice", "score", "noul"])
        ins = r.choice(["Which queue should handle this?", "How urgent is this?", "Is it a refund?",
                        "Welche Abteilung?", "¿Es urgente?", "是否退款？", LONG_EN, 42, {"task": "x"}, ["a", 1]])
        if t == "choice":
            d = q(t, ins, self.choice_crit())
        elif t == "score":
            d = q(t, ins, self.score_crit())
        else:
            d = q(t, ins)
            x = r.random()
            if x < 0.2:
                d["criteria"] = {"true": "yes it is", "false": "no it is not"}
            elif x < 0.3:
                d["labels"] = {"false": "No", "true": "Yes"}
        if r.random() < 0.12:
            n = 2 if t == "noul" else len(d["criteria"])
            order = list(range(n))
            r.shuffle(order)
            d["option_order"] = order
        return d

    def questions(self, n=None):
        n = self.r.choice([1, 1, 1, 2, 2, 3, 5]) if n is None else n
        return {"q%d" % i: self.question() for i in range(n)}

    def state(self):
        r = self.r
        x = r.random()
        if x < 0.6:
            return STATES[r.choice(sorted(STATES))]
        if x < 0.7:
            return LONG_EN * r.choice([2, 6, 40])
        if x < 0.8:
            return [{"role": "user" if i % 2 == 0 else "agent", "content": STATES[r.choice(sorted(STATES))]}
                    for i in range(r.choice([1, 3, 8]))]
        if x < 0.9:
            return {"message": STATES[r.choice(sorted(STATES))], "amount": 12.5, "ok": True, "n": None}
        return r.choice([42, 3.5, True, False, 0, {}, [], "null"])


def families(g):
    r = g.r
    # ---- choice / score / noul criteria forms on three checkpoints (routing by state)
    choice_forms = [
        {"billing": "payment problems", "tech": "technical issue", "other": "anything else"},
        {"a": "", "b": None, "c": "the third option"},
        {"low": 0, "mid": 1.5, "high": False, "max": True},
        {"scam": {"desc": "fraud", "score": 0.1}, "ok": ["fine", 100.0], "unsure": {}},
        ["yes", "no", "maybe"], ["positive", "negative", "neutral"], ["only"], {"refund": "give money back"},
        {"yes": "", "no": ""}, LABELS[:6], LABELS[:10], LABELS[:11], LABELS,
        {"Rückerstattung": "Geld zurück", "技术": "技术问题", "😀": None},
        [1, 2, 3], [True, False], [1.5, "x"], ["[MASK]a", "<mask>b"],
        {lab: "this option description is fairly long and keeps going for a while" for lab in LABELS},
    ]
    for sk in ("en", "de", "ja"):
        for crit in choice_forms:
            g.addj("choice_forms", {"state": STATES[sk], "questions": {"c": q("choice", "Pick one", crit)}})
    score_forms = [["low", "medium", "high"], ["minor", "major"], ["only level"], ["", "", "ok", "", "best"],
                   ["level %d" % i for i in range(11)], ["l%d" % i for i in range(6)], [0, 1.5, "x", True],
                   [{"d": "x"}, ["a", 2]], ["not urgent", "somewhat urgent", "urgent", "critical"],
                   ["a", "b", "c", "d", "e"]]
    for sk in ("en", "de", "ja"):
        for crit in score_forms:
            g.addj("score_forms", {"state": STATES[sk], "questions": {"s": q("score", "Rate it", crit)}})
    noul_forms = [None, {"true": "refund", "false": "no refund"}, {"TRUE": "a", "False": "b"}, {"true": None},
                  {"true": {"means": "refund"}}, {}, "LABELS", "LABELS_CRIT"]
    for sk in ("en", "de", "ja"):
        for crit in noul_forms:
            if crit == "LABELS":
                d = q("noul", "Refund requested?", labels={"false": " No ", "true": "Yes"})
            elif crit == "LABELS_CRIT":
                d = q("noul", "Is it spam?", {"true": "spam", "false": "legit"}, labels={"true": "SPAM", "false": "HAM"})
            else:
                d = q("noul", "Refund requested?", crit)
            g.addj("noul_forms", {"state": STATES[sk], "questions": {"n": d}})
    # ---- 0.4.15 controls, valid
    ctl_valid = ([("task", v) for v in ("typed-decisions", "typed_decisions", "typed", "english", "ml", None)]
                 + [("lang", v) for v in ("de", "en", "en_US.UTF-8", "EN-gb", "fr", "C", "POSIX", "C.UTF-8",
                                          "und", "zxx", "mul", "", "  ", None)]
                 + [("lang_guess", v) for v in ("de", "en", "ja_JP", "c", "posix", "und", "zxx", "mul", "", None)]
                 + [("max_len", v) for v in (32, 64, 96, 128, 200, 600, 8192, None)]
                 + [("head_max_len", v) for v in (16, 24, 40, 64, 100, None)]
                 + [("min_confidence", v) for v in (0, 0.0, 0.3, 0.5, 0.99, 1, 1.0, 1e-9, None,
                                                    {"default": 0.5}, {"choice:3-5": 0.9, "default": 0.2},
                                                    {"noul:2": 0.6}, {"score:3-5": 0.3, "choice:2": 0.1},
                                                    {"choice:11+": 0.1, "score:6-10": 0.2, "noul:3-5": 0.3})])
    for key, val in ctl_valid:
        for sk in r.sample(["en", "de", "ru", "pt_short", "digits", "en_short"], 2):
            g.addj("controls_valid", {"state": STATES[sk], "questions": {"queue": Q_CHOICE, "u": Q_SCORE, "r": Q_NOUL},
                                      key: val})
    # ---- 0.4.15 controls, invalid values
    ctl_invalid = ([("task", v) for v in ("classification", "", 5, True, False, ["typed"], "englsh", {"a": 1})]
                   + [("lang", v) for v in (7, True, ["en"], {"code": "en"}, 1.5)]
                   + [("lang_guess", v) for v in (1, False, {}, [], 0.0)]
                   + [("max_len", v) for v in (8193, 0, -5, True, False, 64.0, 1.5, "64", [64], 10 ** 20, 20)]
                   + [("head_max_len", v) for v in (8193, 0, -1, True, "x", 40.0, 8192)]
                   + [("min_confidence", v) for v in (1.5, -0.1, True, "0.5", [0.5], {}, {"choice:4": 0.5},
                                                      {"choice:3-5": 2}, {"default": True}, {"default": None},
                                                      {"": 0.1}, {"Choice:2": 0.5})])
    for key, val in ctl_invalid:
        g.addj("controls_invalid", {"state": EN, "questions": {"queue": Q_CHOICE, "r": Q_NOUL}, key: val})
    g.add("controls_invalid", '{"state": "refund please", "questions": {"r": {"type": "noul", "instructions": "x"}}, '
                              '"min_confidence": NaN}', tags=["nan_literal"])
    g.add("controls_invalid", '{"state": "refund please", "questions": {}, "max_len": Infinity}', tags=["nan_literal"])
    # check order between controls
    order_pairs = [{"max_len": 0, "head_max_len": "x"}, {"max_len": 0, "lang": 1}, {"lang": 1, "lang_guess": 2},
                   {"lang": 1, "min_confidence": 2}, {"task": "nope", "min_confidence": 0.5},
                   {"task": "nope", "lang": "de"}, {"model": "./x", "max_len": 0}, {"hooks": 1, "max_len": 0},
                   {"model": "ml", "task": "typed"}, {"lang": "de", "model": "english"},
                   {"lang": "de", "task": "typed-decisions"}, {"lang": "en", "lang_guess": "de"},
                   {"lang": "C.UTF-8", "lang_guess": "de"}, {"min_confidence": 3, "questions": {"q": "bad"}},
                   {"task": "nope", "questions": {"q": {"type": "bogus"}}}]
    for extra in order_pairs:
        body = {"state": EN, "questions": {"r": Q_NOUL}}
        body.update(extra)
        g.addj("controls_order", body)
    # ---- option_order
    oo_valid = [("choice", ["a", "b", "c"], [2, 0, 1]), ("choice", ["a", "b", "c"], [0, 1, 2]),
                ("choice", {"billing": "x", "tech": "y", "other": "z"}, [1, 2, 0]),
                ("score", ["l", "m", "h", "c"], [3, 2, 1, 0]), ("noul", None, [1, 0]), ("noul", None, [0, 1]),
                ("choice", LABELS, list(range(11, -1, -1))), ("choice", [10, 20, 30], [2, 1, 0]),
                ("score", ["a", "b"], [1, 0])]
    for sk in ("en", "de", "ja"):
        for t, crit, order in oo_valid:
            g.addj("option_order", {"state": STATES[sk], "questions": {"x": q(t, "Pick", crit, option_order=order)}})
    oo_invalid = [[0, 1], [0, 1, 2, 3], [0, 0, 1], [0, 1, 3], [-1, 0, 1], ["0", "1", "2"], [0.0, 1.0, 2.0],
                  [True, False, 0], None, "012", {"0": 1}, [[0], [1], [2]], []]
    for order in oo_invalid:
        g.addj("option_order", {"state": EN, "questions": {"c": q("choice", "Pick", ["a", "b", "c"], option_order=order)}})
    for order in ([True, False], [0], [1, 1], None):
        g.addj("option_order", {"state": EN, "questions": {"n": q("noul", "ok?", option_order=order)}})
    # ---- long states (> max_len tokens, > 4000 chars), truncation, with and without max_len
    for mult in (2, 6, 30, 60):
        for ml in (None, 64, 128, 512):
            body = {"state": LONG_EN * mult, "questions": {"queue": Q_CHOICE, "r": Q_NOUL}}
            if ml:
                body["max_len"] = ml
            g.addj("long_states", body)
    for mult in (3, 20, 80):
        g.addj("long_states", {"state": LONG_RU * mult, "questions": {"r": Q_NOUL, "u": Q_SCORE}})
        g.addj("long_states", {"state": [{"role": "user", "content": LONG_EN}] * mult, "questions": {"r": Q_NOUL}})
        g.addj("long_states", {"state": [{"role": "user", "content": LONG_RU}] * mult, "questions": {"r": Q_NOUL},
                               "max_len": 64})
        g.addj("long_states", {"state": {"subject": "refund", "body": LONG_EN * mult}, "questions": {"r": Q_NOUL}})
    g.addj("long_states", {"state": "the customer wants a refund " * 140 + " Мне нужна помощь с заказом номер " * 20,
                           "questions": {"r": Q_NOUL}})
    g.addj("long_states", {"state": ["word " * 900, "Привет как дела мне нужна помощь " * 40], "questions": {"r": Q_NOUL}})
    g.addj("long_states", {"state": "a" * 50000, "questions": {"r": Q_NOUL}})
    g.addj("long_states", {"state": "😀" * 5000, "questions": {"r": Q_NOUL}})
    # ---- multilingual and mixed-script states
    for sk in sorted(STATES):
        g.addj("multilingual", {"state": STATES[sk], "questions": {"queue": Q_CHOICE, "r": Q_NOUL}})
        g.addj("multilingual", {"state": {"message": STATES[sk], "meta": {"lang": "?"}}, "questions": {"u": Q_SCORE}})
    for a, b in (("en", "ru"), ("en", "de"), ("en", "ja"), ("fr", "en"), ("en", "ar"), ("ko", "en")):
        g.addj("multilingual", {"state": STATES[a] + "\n" + STATES[b], "questions": {"r": Q_NOUL}})
        g.addj("multilingual", {"state": {"subject": STATES[a], "body": STATES[b]}, "questions": {"r": Q_NOUL}})
    # ---- JSON / array states
    json_states = [{"a": 12.5, "tiny": 1e-05, "small": 0.0001, "x": 1e-300}, {"big": 1e+16, "e15": 1e15},
                   {"neg0": -0.0, "hundred": 100.0}, {"pt1": 0.1, "g": 2.675}, {"n": {"d": [1.0, [2.25, {}]]}},
                   [True, False, None, 0, "refund"], ["hello", "I want a refund"], {"zeta": "z", "alpha": "a"},
                   {"Привет": 1, "text": "refund the invoice please"}, [], {}, [[[["deep"]]]], 42, 3.5, True, False,
                   0, "null", [{"role": "user", "content": "hi"}, {"role": "agent", "content": "hello"}]]
    for st in json_states:
        g.addj("json_states", {"state": st, "questions": {"r": Q_NOUL}})
        g.addj("json_states", {"state": st, "questions": {}})
    g.add("json_states", '{"state": {"bigint": 12345678901234567890, "negbig": -98765432109876543210987654321}, '
                         '"questions": {"r": {"type": "noul", "instructions": "x"}}}')
    g.add("json_states", '{"state": {"a": "first", "b": "middle", "a": "refund please"}, '
                         '"questions": {"r": {"type": "noul", "instructions": "Refund?"}}}')
    g.add("json_states", '{"state": {"msg": "caf\\u00e9 \\u8acb \\ud83d\\ude00 t\\tn\\n\\u0001c"}, '
                         '"questions": {"r": {"type": "noul", "instructions": "x"}}}')
    g.add("json_states", '{"state": {"a": NaN, "b": Infinity, "msg": "refund please now"}, '
                         '"questions": {"r": {"type": "noul", "instructions": "Refund?"}}}', tags=["nan_literal"])
    g.add("json_states", '{"state": 1e400, "questions": {}}', tags=["nan_literal"])
    # ---- HTTP-level errors (§1.3, §1.8)
    errs = [b'{"state": "x", "questions": {', b"", b'{"state": "\xff\xfe bad", "questions": {}}', b'[{"questions": {}}]',
            b'"questions"', b"42", b"null", b'{"state": "hello"}', b'{"state": "hello", "questions": []}',
            b'{"state": "hello", "questions": "q"}', b'{"state": "hello", "questions": null}',
            b'{"questions": {}}', b'{"state": null, "questions": {}}', b'{"state": null, "questions": "x"}',
            b'{"questions": "x", "state": "hello", "questions": {}}', b"\xef\xbb\xbf" + b'{"state": "hello", "questions": {}}',
            '{"state": "hello", "questions": {}}'.encode("utf-16"), b'{"state": "x", "questions": {}} x',
            b'{"state": "x", "questions": {}} \n\t ', b"{}", b'{"state": "x"', b"not json", b"\x00",
            b'{"state": "x", "questions": {"r": {"type": "noul", "instructions": "y"}}, "questions": {}}']
    for b in errs:
        g.add("errors_http", b)
    g.add("errors_http", J({"state": "hello", "questions": {"q%d" % i: Q_NOUL for i in range(65)}}))
    g.add("errors_http", J({"state": "hi", "questions": {"q%d" % i: q("noul", "ok?") for i in range(64)}}))
    g.add("errors_http", J({"state": "hello", "questions": {"q%d" % i: "bad" for i in range(65)}}))
    g.add("errors_http", J({"questions": {"q%d" % i: Q_NOUL for i in range(65)}}))
    g.add("errors_http", J({"state": "a" * 50001, "questions": {}}))
    g.add("errors_http", J({"state": "a" * 50000, "questions": {}}))
    g.add("errors_http", J({"state": {"k": "x" * 49995}, "questions": {}}))
    g.add("errors_http", J({"state": {"k": '"' * 30000}, "questions": {}}))
    g.add("errors_http", J({"state": [1] * 16667, "questions": {}}))
    g.add("errors_http", J({"state": {"k%d" % i: "x" * 90 for i in range(520)}, "questions": {}}))
    g.add("errors_http", J({"state": "a" * 50001, "questions": "x"}))
    g.add("errors_http", J({"state": "a" * 50001, "questions": {"q%d" % i: Q_NOUL for i in range(65)}}))
    g.add("errors_http", J({"state": "a", "pad": "x" * 2100000, "questions": {}}))
    ok = J({"state": EN, "questions": {"r": Q_NOUL}})
    g.add("errors_http", ok, headers={"content-type": "text/plain"})
    g.add("errors_http", b'{"questions": {}, "state": ' + b"[" * 129 + b"]" * 129 + b"}", tags=["deep_nesting"])
    g.add("errors_http", b'{"questions": {}, "state": ' + b"[" * 5000 + b"]" * 5000 + b"}", tags=["deep_nesting"])
    g.add("errors_http", b'{"questions": {}, "state": ' + b"[" * 128 + b"]" * 128 + b"}")
    g.add("errors_http", b'{"questions": {}, "state": ' + b'{"a":' * 127 + b"1" + b"}" * 127 + b"}")
    # ---- question validation errors (§2.1, §2.2)
    bad_qs = [{"q": "what?"}, {"q": [1, 2]}, {"q": None}, {"q": 3.5}, {"q": True},
              {"q": {"type": "multi", "instructions": "x"}}, {"q": {"instructions": "x"}},
              {"q": {"type": 1, "instructions": "x"}}, {"q": {"type": "Choice", "instructions": "x", "criteria": ["a"]}},
              {"q": {"type": ["choice"], "instructions": "x", "criteria": ["a"]}},
              {"q": {"type": {"t": "choice"}, "instructions": "x"}}, {"q": {"type": None, "instructions": "x"}},
              {"q": {"type": "noul"}}, {"it's": {"type": "choice", "criteria": ["a"]}},
              {"ключ\n\t\u0001é😀": {"type": "bogus"}}, {"a'b\"c\\d": {"type": "bogus"}},
              {"q": {"type": "choice", "instructions": "x"}}, {"q": q("choice", "x", "a,b")}, {"q": q("choice", "x", 3)},
              {"q": q("choice", "x", {})}, {"q": q("choice", "x", [])}, {"q": q("score", "x", {"0": "low"})},
              {"q": {"type": "score", "instructions": "x"}}, {"q": q("score", "x", [])},
              {"q": q("noul", "x", ["true", "false"])}, {"q": q("noul", "x", "yes")},
              {"q": q("noul", "x", {"yes": "a", "TRUE": "b", "No": "c"})}, {"q": q("noul", "x", {"true": "a", "maybe": "b"})},
              {"q": q("choice", "x", ["a"], labels={"false": "n", "true": "y"})},
              {"q": q("score", "x", ["a"], labels=None)}, {"q": q("noul", "x", labels={"true": "y"})},
              {"q": q("noul", "x", labels={"true": "y", "false": "n", "x": "z"})},
              {"q": q("noul", "x", labels={"true": 1, "false": "n"})}, {"q": q("noul", "x", labels={"true": "  ", "false": "n"})},
              {"q": q("noul", "x", labels={"true": " y", "false": "y "})}, {"q": q("noul", "x", labels=["n", "y"])},
              {"q": q("noul", "x", labels={"TRUE": "y", "FALSE": "n"})},
              {"ok": Q_NOUL, "bad1": {"type": "x", "instructions": "i"}, "bad2": "str"},
              {"": Q_NOUL}, {"  ": Q_NOUL}, {"\t\n": Q_NOUL}, {"\u00a0": Q_NOUL}, {"\u200b": Q_NOUL},
              {"n": q("noul", None)}, {"n": q("noul", "")}, {"n": q("noul", " \t ")}, {"n": q("noul", [])},
              {"n": q("noul", {})}, {"n": q("noul", 0)}, {"n": q("noul", False)}, {"n": q("noul", [""])},
              {"c": q("choice", "x", [1, 1.0])}, {"c": q("choice", "x", [True, 1])}, {"c": q("choice", "x", ["a", False, 0])},
              {"c": q("choice", "x", ["a", "b", "a"])}, {"c": q("choice", "x", ["a", None])},
              {"c": q("choice", "x", [{"a": 1}, "b"])}, {"c": q("choice", "x", ["b", ["a"]])}, {"c": q("choice", "x", [[]])},
              {"c": q("choice", "x", [0, "0"])}, {"s": q("score", "x", ["low", None, "high"])},
              {"c": q("choice", "x", [1, 2])}, {"c": q("choice", "x", [None, "a"])}]
    for qs in bad_qs:
        tags = []
        crit = next(iter(qs.values()))
        if isinstance(crit, dict):
            c = crit.get("criteria")
            if crit.get("type") == "choice" and isinstance(c, list) and not all(isinstance(x, str) for x in c):
                tags.append("non_string_labels")
            if isinstance(crit.get("type"), (list, dict)):
                tags.append("type_list_or_object")
        g.addj("errors_question", {"state": EN, "questions": qs}, tags=tags)
    g.addj("errors_question", {"state": DE, "questions": {"q": q("score", "x", "nope")}})
    # ---- empty questions (routing only)
    for sk in sorted(STATES):
        g.addj("empty_questions", {"state": STATES[sk], "questions": {}})
    # ---- multi-question requests
    for n in (2, 3, 5, 8, 12, 20, 40, 64):
        for sk in ("en", "de", "ja"):
            g.addj("multi_question", {"state": STATES[sk], "questions": g.questions(n)})
    g.add("multi_question", '{"state": "' + EN + '", "questions": {"a": {"type": "choice", "instructions": "x", '
                            '"criteria": ["p", "q"]}, "b": {"type": "noul", "instructions": "y"}, '
                            '"a": {"type": "score", "instructions": "z", "criteria": ["0", "1", "2"]}}}')
    wf = {"action": q("choice", "Next action?", ["refund", "reply", "escalate"]),
          "category": q("choice", "Category?", ["billing", "tech", "other"]),
          "churn_risk": q("score", "Churn risk?", ["low", "medium", "high"]),
          "needs_human": q("noul", "Needs a human?"), "urgency": q("score", "Urgency?", ["low", "high"])}
    g.addj("multi_question", {"state": EN, "questions": wf})
    # ---- model names and aliases
    models = ["ML", " Multilingual ", "EN", "english", "typed", "typed_decisions", " Decisions ", "laya", "default",
              "multi", "laya-multilingual", "laya-typed-decisions", "convaiinnovations/laya",
              "convaiinnovations/laya-multilingual", "ConvAIInnovations/Laya-Typed-Decisions",
              "convaiinnovations/laya/multilingual", "convaiinnovations/laya-english", "jev-latest", "jev-1", "",
              "   ", "auto", "englsh", "./ckpt", "~/ckpt", ".", ".hidden", "acme/laya", "a\\b", "/models/laya",
              0, False, None, {}, [], 5, True, "True", ["ml"], ["a/b"], {"a": "/"}, 1.0, "\tml\n"]
    for m in models:
        for sk in ("en", "de"):
            g.addj("model", {"state": STATES[sk], "questions": {"r": Q_NOUL}, "model": m})
    # ---- 0.4.15 limits
    lim = [{"c": q("choice", "Pick", ["o%d" % i for i in range(101)])},
           {"c": q("choice", "Pick", ["o%d" % i for i in range(100)])},
           {"c": q("choice", "Pick", {"o%d" % i: "" for i in range(101)})},
           {"c": q("choice", "Pick", [None] * 101)}, {"s": q("score", "Rate", ["l%d" % i for i in range(33)])},
           {"s": q("score", "Rate", ["l%d" % i for i in range(32)])},
           {"s": q("score", "Rate", [None] + ["l%d" % i for i in range(32)])},
           {"a": q("score", "Rate", ["low", None]), "b": q("choice", "Pick", ["o%d" % i for i in range(101)])},
           {"c%d" % i: q("choice", "Pick", ["o%d" % j for j in range(90)]) for i in range(6)},
           dict({"c%d" % i: q("choice", "Pick", ["o%d" % j for j in range(100)]) for i in range(5)},
                s=q("score", "Rate", ["l%d" % j for j in range(13)])),
           {"c": q("choice", "Pick", ["o%d" % i for i in range(25)])}]
    for qs in lim:
        g.addj("limits", {"state": EN, "questions": qs})
    g.addj("limits", {"state": EN, "questions": {"c": q("choice", "Pick", ["o%d" % i for i in range(100)])},
                      "max_len": 512, "head_max_len": 400})
    g.addj("limits", {"state": EN, "questions": dict({"c%d" % i: q("choice", "Pick", ["o%d" % j for j in range(100)])
                                                      for i in range(5)}, s=q("score", "Rate", ["l%d" % j for j in range(12)])),
                      "max_len": 512, "head_max_len": 400})
    g.addj("limits", {"state": "a" * 50001, "questions": {"c": q("choice", "Pick", ["o%d" % i for i in range(101)])}})
    g.addj("limits", {"state": "a" * 50001, "questions": {}, "hooks": ["x"]})
    # ---- hook fields and lone surrogates
    for key, val in (("hooks", ["cache"]), ("hooks", False), ("hooks", []), ("on_predict_start", "f"),
                     ("on_predict_end", 1), ("hooks_raise", True), ("hooks_timeout", 5), ("hooks", None),
                     ("hooks_raise", None)):
        g.addj("hooks_surrogates", {"state": EN, "questions": {"r": Q_NOUL}, key: val})
    g.addj("hooks_surrogates", {"state": EN, "questions": {"r": Q_NOUL}, "hooks_timeout": 1, "on_predict_end": "x",
                                "hooks": "y"})
    surr = ['{"state": "refund \\ud800 please", "questions": {"r": {"type": "noul", "instructions": "x"}}}',
            '{"state": "refund please", "questions": {"c": {"type": "choice", "instructions": "x", '
            '"criteria": {"a": "bad \\udc80 text"}}}}',
            '{"state": "x", "questions": {"\\ud83d": {"type": "noul", "instructions": "x"}}}',
            '{"state": "x", "questions": {}, "extra": ["\\udfff"]}', '{"state": {"\\ud800": "x"}, "questions": {}}',
            '{"state": "x", "questions": {}, "model": "\\ud800"}', '{"state": "x \\ude00\\ud83d", "questions": {}}',
            '{"state": "\\ud800", "questions": {}, "model": "./x"}',
            '{"state": "refund \\ud800", "questions": {}, "hooks": 1}']
    for s in surr:
        g.add("hooks_surrogates", s, tags=["lone_surrogate"])
    g.add("hooks_surrogates", '{"state": "refund \\ud83d\\ude00 please", "questions": {"r": {"type": "noul", '
                              '"instructions": "x"}}}')
    # ---- compressed body (layad decodes Content-Encoding)
    import gzip
    g.add("content_encoding", gzip.compress(ok.encode(), mtime=0), headers={"content-encoding": "gzip"},
          tags=["content_encoding"])
    # ---- random compositions
    for _ in range(260):
        body = {"state": g.state(), "questions": g.questions()}
        for key, vals in (("model", ["ml", "en", "typed", "jev-1", None]), ("task", ["typed", "english", None]),
                          ("lang", ["de", "en", "C", None]), ("lang_guess", ["de", "en", "und"]),
                          ("max_len", [64, 128, 300]), ("head_max_len", [24, 48, 64]),
                          ("min_confidence", [0.5, {"default": 0.4}, 0.9])):
            if r.random() < 0.08:
                body[key] = r.choice(vals)
        g.addj("random_mix", body)


def golden_requests(g):
    """Every body of goldens-0.4.15 cases.json / language.json (0.4.15 includes all 0.3.20 cases), and
    the bad_requests.json bodies that are plain POSTs to /v1/systemone on the main app."""
    for fname, key, cat in (("cases.json", "cases", "golden_cases"), ("language.json", "samples", "golden_language")):
        path = os.path.join(GOLDENS_0415, fname)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            items = json.load(f)[key]
        for c in items:
            tags = []
            b = c["body"]
            if "NaN" in b or "Infinity" in b or "1e400" in b:
                tags.append("nan_literal")
            if "\\ud8" in b or "\\udc" in b or "\\udf" in b or "\\ude" in b:
                tags.append("lone_surrogate")
            g.out.append({"id": "%s/%s" % (cat, c["name"]), "category": cat, "method": "POST",
                          "path": "/v1/systemone", "headers": {}, "body": b.encode("utf-8"), "tags": tags})
    path = os.path.join(GOLDENS_0415, "bad_requests.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            items = json.load(f)["requests"]
        for c in items:
            if (c["app"] != "main" or c["method"] != "POST" or c["path"] != "/v1/systemone" or c["chunked"]
                    or c["body_base64"] is None or "content-length" in c["headers"]
                    or "content-encoding" in c["headers"]):
                continue
            tags = ["nan_literal"] if c["name"] in ("nan_infinity_in_state_accepted", "big_exponent_inf_state") else []
            if "lone_surrogate" in c["name"]:
                tags.append("lone_surrogate")
            if "deeply_nested" in c["name"]:
                tags.append("deep_nesting")
            g.out.append({"id": "golden_http/%s" % c["name"], "category": "golden_http", "method": "POST",
                          "path": "/v1/systemone", "headers": dict(c["headers"]),
                          "body": base64.b64decode(c["body_base64"]), "tags": tags})


BATCH = "/v1/systemone/batch"


def batch_requests(seed):
    """`POST /v1/systemone/batch` (0.4.15's route; 0.3.20 answers 404): good batches of every state
    shape with shared questions and the controls, and every refusal in its order. A generator of its
    own (seed + 1), so adding it left the single-route bodies byte for byte as they were."""
    g = Gen(seed + 1)
    r = g.r
    add = lambda obj, tags=(): g.addj("batch", obj, tags, path=BATCH)  # noqa: E731
    for n in (1, 2, 3, 8, 64):
        add({"states": [g.state() for _ in range(n)], "questions": g.questions()})
    for _ in range(40):
        body = {"states": [g.state() for _ in range(r.choice([1, 2, 3, 5, 9]))], "questions": g.questions()}
        for key, vals in (("model", ["ml", "en", "typed", None]), ("task", ["typed", None]),
                          ("lang", ["de", "en", None]), ("lang_guess", ["de", "und"]),
                          ("max_len", [64, 128]), ("head_max_len", [32, 64]),
                          ("min_confidence", [0.5, {"default": 0.4}, 0.95]),
                          ("batch_size", [1, 2, 7, 100]), ("sort_by_length", [True, False, None])):
            if r.random() < 0.25:
                body[key] = r.choice(vals)
        add(body)
    add({"states": [EN, DE, STATES["ja"]], "questions": {}})
    add({"states": [EN, DE], "questions": {"a": Q_CHOICE, "b": Q_SCORE, "c": Q_NOUL}, "batch_size": 1,
         "sort_by_length": True})
    # refusals, in upstream's order
    qs = {"a": Q_CHOICE}
    g.add("batch_invalid", b"{", path=BATCH)
    g.add("batch_invalid", b"", path=BATCH)
    for obj in ([EN], {"state": EN, "questions": qs}, {"states": [EN]}, {"questions": qs},
                {"states": [], "questions": qs}, {"states": EN, "questions": qs}, {"states": None, "questions": qs},
                {"states": [EN] * 65, "questions": "x"}, {"states": [EN, None], "questions": qs},
                {"states": [None], "questions": []}, {"states": [EN], "questions": []},
                {"states": [EN], "questions": {"q%d" % i: Q_NOUL for i in range(65)}},
                {"states": [EN, "x" * 50001], "questions": qs},
                {"states": [EN], "questions": {"c": q("choice", "?", ["o%d" % i for i in range(101)])}},
                {"states": [EN], "questions": {"s": q("score", "?", ["a", None])}},
                {"states": [EN], "questions": qs, "hooks": 1, "on_predict_end": "x"},
                {"states": [EN], "questions": qs, "diagnostics": {}},
                {"states": [EN], "questions": qs, "diagnostics": None},
                {"states": [EN], "questions": qs, "model": "./local"},
                {"states": [EN], "questions": qs, "max_len": 0},
                {"states": [EN], "questions": qs, "max_len": 9000},
                {"states": [EN], "questions": qs, "lang": 5},
                {"states": [EN], "questions": qs, "min_confidence": 2},
                {"states": [EN], "questions": qs, "batch_size": 0},
                {"states": [EN], "questions": qs, "batch_size": -2},
                {"states": [EN], "questions": qs, "batch_size": True},
                {"states": [EN], "questions": qs, "batch_size": 1.5},
                {"states": [EN], "questions": qs, "batch_size": "3"},
                {"states": [EN], "questions": qs, "sort_by_length": "yes"},
                {"states": [EN], "questions": qs, "sort_by_length": 1},
                {"states": [EN], "questions": qs, "task": "chess"},
                {"states": [EN, DE], "questions": {"a": {"type": "choice"}}},
                {"states": [EN], "questions": {"a": q("choice", "?", ["x", "x"])}},
                {"states": [EN], "questions": {"a": q("noul", None)}, "task": "chess"},
                {"states": [EN], "questions": qs, "sort_by_length": 1, "batch_size": 0, "max_len": "x"}):
        g.addj("batch_invalid", obj, path=BATCH)
    g.add("batch_invalid", '{"states": ["\\ud800x"], "questions": {}}'.replace("\\\\", "\\"), ["lone_surrogate"],
          path=BATCH)
    return g.out


def tournament_requests(seed):
    """Tournament choices (0.4.15's `LAYA_TOURNAMENT_GROUP`; run them with `--tournament 16`, else
    both sides refuse the wide ones with 413): list and dict criteria of 17-255 labels beside other
    questions, several wide choices in one request, `option_order` kept (one pass) and dropped,
    labels that are not strings, the controls, the refusals (256 options, a bad choice beside a wide
    one) and the batch route. A generator of its own (seed + 2), so the other bodies stay as they were."""
    g = Gen(seed + 2)
    r = g.r
    add = lambda obj, tags=(), path="/v1/systemone": g.addj("tournament", obj, tags, path=path)  # noqa: E731

    def wide(n, form="list", **extra):
        names = ["%s %03d" % (r.choice(LABELS), i) for i in range(n)]
        crit = names if form == "list" else {name: r.choice(["", "queue for " + name, None, 0.5]) for name in names}
        return q("choice", "Which intent is this?", crit, **extra)

    states = [EN, DE, STATES["ja"], STATES["en2"], STATES["ru"], LONG_EN * 3]
    for n in (17, 33, 64, 100, 101, 128, 200, 255):
        for form in ("list", "dict"):
            add({"state": r.choice(states), "questions": {"intent": wide(n, form), "refund": Q_NOUL}})
    add({"state": EN, "questions": {"a": wide(128), "b": Q_SCORE, "c": wide(40, "dict"), "d": Q_CHOICE}})
    add({"state": DE, "questions": {"x": wide(255, "dict"), "y": wide(255)}})
    add({"state": EN, "questions": {"a": wide(50, option_order=list(reversed(range(50))))}})
    add({"state": EN, "questions": {"a": wide(120, option_order=list(reversed(range(120))))}})
    add({"state": EN, "questions": {"a": wide(50), "b": wide(120, option_order=list(range(120)))}})
    add({"state": EN, "questions": {"a": q("choice", "?", list(range(50)))}})
    add({"state": EN, "questions": {"a": q("choice", "?", list(range(101)))}})
    add({"state": EN, "questions": {"a": q("choice", "?", list(range(40))), "b": wide(101)}})
    for key, value in (("max_len", 128), ("head_max_len", 64), ("min_confidence", 0.9),
                       ("min_confidence", {"default": 0.2}), ("model", "ml"), ("lang", "de"), ("task", "typed")):
        add({"state": r.choice(states), "questions": {"intent": wide(r.choice([30, 128, 180])), "n": Q_NOUL},
             key: value})
    # refusals
    for obj in ({"state": EN, "questions": {"a": wide(256)}},
                {"state": EN, "questions": {"a": wide(128), "b": {"type": "choice", "instructions": "?"}}},
                {"state": EN, "questions": {"a": wide(128), "b": q("choice", "?", ["x", "x"])}},
                {"state": EN, "questions": {"a": wide(128), "b": q("choice", "?", [])}},
                {"state": EN, "questions": {"a": wide(128), "b": q("choice", "?", "x")}},
                {"state": EN, "questions": {"a": wide(128), "b": q("score", "?", ["a", None])}},
                {"state": EN, "questions": {"a": wide(128), "b": q("noul", None)}},
                {"state": EN, "questions": {"a": wide(128, instructions=None)}},
                {"state": EN, "questions": {"a": wide(128)}, "task": "chess"},
                {"state": EN, "questions": {"a": wide(128)}, "max_len": 9000}):
        add(obj, ["refusal"])
    # the batch route
    for n in (1, 3, 8):
        add({"states": [r.choice(states) for _ in range(n)], "questions": {"intent": wide(128), "n": Q_NOUL}},
            path=BATCH)
    add({"states": [EN, DE], "questions": {"a": wide(200, "dict"), "b": Q_SCORE}, "batch_size": 1,
         "sort_by_length": True}, path=BATCH)
    add({"states": [EN, DE], "questions": {"a": wide(30)}}, path=BATCH)
    add({"states": [EN], "questions": {"a": wide(256)}}, ["refusal"], path=BATCH)
    add({"states": [EN], "questions": {"a": q("choice", "?", list(range(101)))}}, ["refusal"], path=BATCH)
    return g.out


#: The extra checkpoints `--extra` registers on both sides (LAYA_EXTRA_MODELS): a local directory
#: (a copy of the fixture english checkpoint) and a Hub repo with a subfolder (a copy of the fixture
#: bundle in each side's cache under another repo id). Canonical names after upstream's lower().
EXTRA_DIR_NAME = "mine"
EXTRA_REPO_NAME = "bundle.ml"
EXTRA_REPO_ID = "me/laya-bundle"


def extra_requests(seed):
    """Requests naming the extra checkpoints (run them with `--extra`): `model=` and `task=` in every
    spelling upstream's `canonical_name` accepts, on both routes, with every question type and the
    controls, plus refusals whose detail lists the registered names. A generator of its own
    (seed + 3), so the other bodies stay as they were."""
    g = Gen(seed + 3)
    r = g.r
    add = lambda obj, tags=(), path="/v1/systemone": g.addj("extra", obj, tags, path=path)  # noqa: E731
    spellings = ["mine", "MINE", " Mine ", "mine\n", "bundle.ml", "Bundle.ML", " bundle.ml"]
    for model in spellings:
        add({"state": g.state(), "questions": g.questions(), "model": model})
    for task in ["mine", "Bundle.ML", "MINE "]:
        add({"state": g.state(), "questions": g.questions(), "task": task})
    for _ in range(12):
        body = {"state": r.choice([EN, DE, STATES["ja"], g.state()]), "questions": g.questions(),
                "model": r.choice([EXTRA_DIR_NAME, EXTRA_REPO_NAME])}
        for key, vals in (("max_len", [16, 64, None]), ("min_confidence", [0.5, {"default": 0.3}, None]),
                          ("lang", ["de", None])):
            v = r.choice(vals)
            if v is not None:
                body[key] = v
        add(body)
    add({"state": EN, "questions": {"a": Q_CHOICE, "b": Q_SCORE, "c": Q_NOUL}, "model": "mine", "task": "typed"})
    add({"state": EN, "questions": {}, "model": "bundle.ml"})
    # names that are not registered: a typo routes automatically, a path-like one is refused with
    # the registered names listed, an unknown task likewise
    add({"state": EN, "questions": {"a": Q_NOUL}, "model": "mine2"})
    add({"state": EN, "questions": {"a": Q_NOUL}, "model": "./mine"}, ["refusal"])
    add({"state": EN, "questions": {"a": Q_NOUL}, "model": EXTRA_REPO_ID}, ["refusal"])
    add({"state": EN, "questions": {"a": Q_NOUL}, "task": "yours"}, ["refusal"])
    add({"states": [EN, DE, STATES["ja"]], "questions": {"a": Q_CHOICE, "b": Q_NOUL}, "model": "mine"}, path=BATCH)
    add({"states": [EN, DE], "questions": {"a": Q_SCORE}, "task": "bundle.ml"}, path=BATCH)
    add({"states": [EN], "questions": {"a": Q_SCORE}, "task": "nope"}, ["refusal"], path=BATCH)
    return g.out


def generate(seed=DEFAULT_SEED, include_goldens=True, include_batch=True, include_tournament=True,
             include_extra=False):
    g = Gen(seed)
    families(g)
    if include_goldens:
        golden_requests(g)
    if include_batch:
        g.out.extend(batch_requests(seed))
    if include_tournament:
        g.out.extend(tournament_requests(seed))
    if include_extra:
        g.out.extend(extra_requests(seed))
    ids = [x["id"] for x in g.out]
    assert len(ids) == len(set(ids))
    return g.out


if __name__ == "__main__":
    import collections
    import hashlib

    reqs = generate()
    h = hashlib.sha256()
    for x in reqs:
        h.update(x["id"].encode() + b"\0" + x["body"] + b"\0")
    print(len(reqs), h.hexdigest())
    for k, v in sorted(collections.Counter(x["category"] for x in reqs).items()):
        print("  %-18s %d" % (k, v))
