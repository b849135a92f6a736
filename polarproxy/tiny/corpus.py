"""A small deterministic corpus for training the tiny tokenizer.

English prose, Python and shell code, JSON documents and chat transcripts with tool calls, all
generated from word lists and templates with a seeded random generator (a few hundred KB).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from polarproxy.tiny import script


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_NOUNS = _words(
    """
    agent model file folder server request response token prompt message tool result error answer
    question user system network cache database record episode reward policy trainer batch sequence
    window river mountain city garden teacher student engineer library book table chair kitchen
    morning evening market village computer program function value number list string object report
    plan idea problem solution test change version
    """
)
_VERBS = _words(
    """
    reads writes sends receives builds checks opens closes finds keeps records returns starts stops
    moves makes takes gives shows needs loads saves parses prints counts tests fixes changes calls
    runs
    """
)
_ADJECTIVES = _words(
    """
    small large quick slow new old exact simple careful bright quiet long short early late clear
    empty full local remote green blue red happy strange useful broken stable random final first
    last
    """
)
_WORDS_EXTRA = _words(
    """
    about above abstract across act action actually add address after again against age ago agree
    air all allow almost alone along already also always among amount analysis animal another answer
    any anyone anything appear apply approach area argue argument arm around arrive art article
    artist ask assert assume async attack attention audience author authority available avoid await
    away baby back bad bag ball bank bar base beat beautiful because become bed before begin
    behavior behind believe benefit best better between beyond big bill bit black blood board body
    boolean born both box boy break bring brother budget buffer build building business buy bytes
    call callable camera campaign cancer candidate capital car card care career carry case catch
    cause cell center central century certain certainly chance change channel character charge check
    child choice choose church citizen claim class clear clearly client close coach cold collection
    college color come commercial common community company compare compile computer concern
    condition conference config consider const consumer contain context continue control cost could
    country couple course court cover create crime cultural culture cup current cursor customer cut
    dark data daughter day dead deal death debate decade decide decision decode decorator deep
    default defense define degree delete democratic describe design despite detail determine develop
    development dict dictionary difference different difficult dinner direction director discover
    discuss discussion disease doctor dog door down draw dream drive drop drug during each early
    east easy eat economic economy edge education effect effort eight either election elif else
    employee encode end endpoint energy enjoy enough enter entire enumerate environment
    environmental especially establish even event ever every everybody everyone everything evidence
    exactly example except executive exist expect experience expert explain export extends eye face
    fact factor fail fall family far fast father fear federal feel feeling few field fight figure
    fill film filter final finally financial find fine finger finish fire firm fish five float floor
    fly focus follow food foot force foreign forget form format former forward four free friend from
    front frozen fund future game garden gas general generation generator girl glass global goal
    good government great ground group grow growth guess gun guy hair half hand handler hang happen
    happy hard have head header health hear heart heat heavy help her here herself high him himself
    his history hit hold home hope hospital hot hotel hour house however huge human hundred husband
    identify image imagine impact import important improve include including increase indeed
    indicate individual industry information inside instance instead institution integer interest
    interesting interface international interview into investment involve isinstance issue item
    iterator itself job join just keep kernel key kid kill kind kitchen know knowledge lambda land
    language large last late latency later laugh law lawyer lay lead leader learn least leave left
    leg legal less letter level lie life light like likely line listen little live logger loss lot
    love low machine magazine main maintain major majority make man manage management manager
    manifest many mapping marriage material matter may maybe mean measure media medical meet meeting
    member memory mention metadata method middle middleware might military million mind minute miss
    mission modern module moment money month more most mother mouth move movement movie much music
    must mutex myself name namespace nation national natural nature near nearly necessary need never
    news newspaper next nice night none nonlocal nor north note nothing notice number occur off
    offer office officer official often oil okay once only onto open operation opportunity option
    optional order organization other others our out outside over override own owner package page
    pain painting paper parent part participant particular particularly partner party pass past
    patient pattern pay payload peace people per perform performance perhaps period person personal
    phone physical pick picture piece pipeline place plan plant play player point pointer police
    political politics poor popular population position positive possible power practice prepare
    present president pressure pretty prevent price private probably process produce product
    production professional professor property protect protected protocol prove provide public pull
    purpose push put quality queue quite race radio raise range rate rather reach read ready real
    reality realize really reason receive recent recently recognize reduce reflect region register
    relate relationship religious remain remember remove represent require research resource respond
    rest return rich right rise risk road rock role room rule runtime safe same sandbox save say
    scene scheduler schema school science scientist score sea season seat second section security
    see seek seem sell send senior sense serialize series serious serve service session set seven
    several shake share she shoot short shot should shoulder show side sign significant similar
    since sing single sister sit site situation six size skill skin social society socket soldier
    some somebody someone something sometimes son song soon sort sorted sound source south southern
    space speak special specific speech spend sport spring staff stage stand standard star state
    statement static staticmethod station stay step still stock stop store story strategy stream
    street strong struct structure student study stuff style subject subprocess success successful
    such suddenly suffer suggest summer super support sure surface switch system take talk task tax
    teach teacher team technology television tell template tend term test than thank their them
    themselves then theory there these they thing think third those though thought thousand thread
    threat three through throughout throw thus time timeout timestamp today together tonight too top
    total tough toward town trade traditional training transaction travel treat treatment tree trial
    trip trouble true truth try tuple turn type typeof under understand unicode union unit unsigned
    until upon usually validate value variable various vector very victim view violence visit voice
    void vote wait walk wall want war watch water way weapon wear week weight well west western what
    whatever where whether which while white whole whom whose why wide wife will win wind window
    wish with within without woman wonder word work worker world worry would wrapper write writer
    wrong yard yeah year yes yet yield young your yourself
    """
)
_ADVERBS = _words(
    """
    quickly slowly carefully again today always never often rarely now
    """
)
_CONNECTORS = _words(
    """
    and but because so while although when after before until
    """
)
_NAMES = _words(
    """
    Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory
    """
)
_UNICODE = (
    "café",
    "naïve",
    "über",
    "façade",
    "déjà vu",
    "jalapeño",
    "smörgåsbord",
    "Ærø",
    "São Paulo",
    "Zürich",
    "日本語",
    "中文",
    "한국어",
    "Привет",
    "Ελληνικά",
    "עברית",
    "العربية",
    "हिन्दी",
    "🙂",
    "🚀",
    "✓",
    "→",
    "—",
    "…",
    "€",
    "£",
    "°C",
    "±",
    "∑",
    "π",
)


def _free_sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS_EXTRA) for _ in range(rng.randint(4, 14))]
    for i in range(1, len(words) - 1):
        if rng.random() < 0.08:
            words[i] += ","
        elif rng.random() < 0.04:
            words[i] = words[i].capitalize()
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "?", "!", ":", ";"))


def _sentence(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return _free_sentence(rng)
    subject = f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    if rng.random() < 0.2:
        subject = rng.choice(_NAMES)
    obj = f"{rng.choice(('a', 'the', 'every', 'one'))} {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    text = f"{subject} {rng.choice(_VERBS)} {obj}"
    if rng.random() < 0.4:
        text += f" {rng.choice(_ADVERBS)}"
    if rng.random() < 0.35:
        text += f", {rng.choice(_CONNECTORS)} the {rng.choice(_NOUNS)} {rng.choice(_VERBS)} it"
    if rng.random() < 0.08:
        text += f" in {rng.choice(_UNICODE)}"
    if rng.random() < 0.1:
        text += f" {rng.randint(0, 100000)} times"
    end = rng.choice((".", ".", ".", "!", "?"))
    if rng.random() < 0.1:
        text = f'"{text[0].upper()}{text[1:]}{end}" said {rng.choice(_NAMES)}'
        end = "."
    return text[0].upper() + text[1:] + end


def prose(rng: random.Random) -> str:
    paragraphs = []
    for _ in range(rng.randint(1, 3)):
        paragraphs.append(" ".join(_sentence(rng) for _ in range(rng.randint(2, 6))))
    return "\n\n".join(paragraphs)


def _identifier(rng: random.Random) -> str:
    parts = [rng.choice(_NOUNS if rng.random() < 0.5 else _WORDS_EXTRA) for _ in range(rng.randint(1, 3))]
    return "_".join(parts)


def python_code(rng: random.Random) -> str:
    name = _identifier(rng)
    args = [_identifier(rng) for _ in range(rng.randint(0, 3))]
    lines = []
    if rng.random() < 0.3:
        lines.append(f"import {rng.choice(('os', 'json', 're', 'sys', 'math', 'pathlib', 'typing'))}\n\n")
    lines.append(f"def {name}({', '.join(args)}):\n")
    lines.append(f'    """{_sentence(rng)}"""\n')
    var = _identifier(rng)
    lines.append(f"    {var} = {rng.choice(('[]', '{}', '0', 'None', repr(rng.choice(_NOUNS))))}\n")
    if args:
        lines.append(f"    for item in {args[0]}:\n")
        lines.append(
            f"        if item {rng.choice(('==', '!=', '>', '<', 'is', 'in'))} {rng.randint(0, 99)}:\n"
        )
        lines.append(f"            {var} += {rng.choice(('item', '1', 'len(item)', 'str(item)'))}\n")
    if rng.random() < 0.5:
        lines.append(f'    print(f"{{{var}}} {rng.choice(_VERBS)} {rng.choice(_NOUNS)}")\n')
    lines.append(f"    return {var}\n")
    if rng.random() < 0.4:
        cls = "".join(p.capitalize() for p in _identifier(rng).split("_"))
        lines.append(f"\n\nclass {cls}:\n    def __init__(self, {args[0] if args else 'value'}=None):\n")
        lines.append(f"        self.{var} = {args[0] if args else 'value'}\n")
    return "".join(lines)


def shell_code(rng: random.Random) -> str:
    commands = []
    for _ in range(rng.randint(1, 5)):
        path = f"{rng.choice(('src', 'tests', 'docs', '.', '/tmp', '~/work'))}/{_identifier(rng)}"
        commands.append(
            rng.choice(
                (
                    f"ls -la {path}",
                    f"cat {path}.txt | grep -n {rng.choice(_NOUNS)}",
                    f"mkdir -p {path} && cd {path}",
                    f"python -m pytest -q tests/test_{_identifier(rng)}.py",
                    f'git commit -m "{_sentence(rng)}"',
                    f"export {rng.choice(_NOUNS).upper()}_DIR={path}",
                    f"curl -s http://127.0.0.1:{rng.randint(1024, 65535)}/health",
                    f"find {path} -name '*.py' | wc -l",
                    f'echo "{rng.choice(_NOUNS)}" > {path}.log',
                    f"pip install {rng.choice(('torch', 'httpx', 'orjson', 'pytest', 'rich'))}",
                )
            )
        )
    return "$ " + "\n$ ".join(commands)


def _json_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.random()
    if depth < 2 and kind < 0.25:
        return {_identifier(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}
    if depth < 2 and kind < 0.4:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind < 0.6:
        return rng.choice(_NOUNS) + (" " + rng.choice(_UNICODE) if rng.random() < 0.1 else "")
    if kind < 0.8:
        return rng.randint(-1000, 100000)
    if kind < 0.9:
        return round(rng.uniform(-10, 10), rng.randint(1, 4))
    return rng.choice((True, False, None))


def json_doc(rng: random.Random) -> str:
    value = {_identifier(rng): _json_value(rng) for _ in range(rng.randint(1, 5))}
    if rng.random() < 0.5:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, indent=rng.choice((2, 4)))


def _tool_schema(rng: random.Random) -> dict:
    props = {
        _identifier(rng): {
            "type": rng.choice(("string", "integer", "boolean")),
            "description": _sentence(rng),
        }
        for _ in range(rng.randint(1, 3))
    }
    return {
        "type": "function",
        "function": {
            "name": _identifier(rng),
            "description": _sentence(rng),
            "parameters": {"type": "object", "properties": props, "required": list(props)[:1]},
        },
    }


def chat_transcript(rng: random.Random) -> str:
    """A transcript in the chat template's wire format (approximately; only the tokenizer sees it)."""
    tools = (
        list(script.TOOLS) if rng.random() < 0.5 else [_tool_schema(rng) for _ in range(rng.randint(1, 3))]
    )
    system = script.SYSTEM_PROMPT if rng.random() < 0.6 else prose(rng)
    out = ["<|im_start|>system\n", system, "\n\n# Tools\n\n<tools>"]
    for tool in tools:
        out.append("\n" + json.dumps(tool, ensure_ascii=False))
    out.append("\n</tools><|im_end|>\n")
    out.append(f"<|im_start|>user\n{rng.choice((*script.USER_PROMPTS, _sentence(rng)))}<|im_end|>\n")
    for _ in range(rng.randint(1, 3)):
        fn = rng.choice(tools)["function"]
        args = {k: rng.choice(_NOUNS) for k in fn["parameters"]["properties"]}
        if rng.random() < 0.3:
            out.append(f"<|im_start|>assistant\n<think>\n{_sentence(rng)}\n</think>\n\n")
        else:
            out.append("<|im_start|>assistant\n")
        out.append(
            f"<tool_call>\n{json.dumps({'name': fn['name'], 'arguments': args})}\n</tool_call><|im_end|>\n"
        )
        result = json_doc(rng) if rng.random() < 0.5 else prose(rng)
        out.append(f"<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n")
    out.append(f"<|im_start|>assistant\n{_sentence(rng)}<|im_end|>\n")
    return "".join(out)


def scripted_transcript(rng: random.Random) -> str:
    workspace = script.random_workspace(rng)
    parts = [script.list_files_result(workspace), script.read_file_result(workspace, "README.md")]
    parts.extend(script.EXPECTED_REPLIES)
    return "\n".join(parts)


def markdown(rng: random.Random) -> str:
    lines = [f"{'#' * rng.randint(1, 3)} {_free_sentence(rng)[:-1]}", ""]
    for _ in range(rng.randint(1, 5)):
        kind = rng.random()
        if kind < 0.3:
            lines.append(f"- {_sentence(rng)}")
        elif kind < 0.5:
            lines.append(f"{rng.randint(1, 9)}. `{_identifier(rng)}` {_free_sentence(rng)}")
        elif kind < 0.7:
            host = rng.choice(("example.com", "localhost:8080", "127.0.0.1:30000", "docs.example.org"))
            lines.append(f"See https://{host}/{_identifier(rng)}/{rng.randint(1, 999)} for details.")
        elif kind < 0.85:
            lines.append(f"| {_identifier(rng)} | {rng.randint(0, 9999)} | {rng.random():.3f} |")
        else:
            lines.append(
                f"id={rng.getrandbits(64):016x} at {rng.randint(2000, 2030)}-{rng.randint(1, 12):02d}"
                f"-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
            )
    return "\n".join(lines) + "\n"


_GENERATORS = (
    (prose, 30),
    (markdown, 10),
    (python_code, 18),
    (shell_code, 10),
    (json_doc, 14),
    (chat_transcript, 8),
    (scripted_transcript, 6),
)


def documents(seed: int = 0, target_bytes: int = 300_000) -> Iterator[str]:
    """Yield corpus documents until about `target_bytes` of UTF-8 text has been produced."""
    rng = random.Random(seed)
    funcs = [f for f, _ in _GENERATORS]
    weights = [w for _, w in _GENERATORS]
    produced = 0
    while produced < target_bytes:
        doc = rng.choices(funcs, weights)[0](rng)
        produced += len(doc.encode("utf-8"))
        yield doc
