"""Which generated tests are real: the test writer's reward (docs/paper.md, "Rewards").

A test earns reward only when
1. it is not degenerate: an assert must call the problem's entry point and may not assert a
   constant or compare a value with itself; a stdin/stdout test needs a non-empty expected output;
2. a correct program passes it: the problem's reference solution, or, for a problem without one,
   the program under test when it passes every ground-truth test (no such program: no reward);
3. it fails at least one wrong program: a mutant of that correct program (for a stdin program an
   empty body or a constant output; for a function one that returns the empty value of the correct
   result's type: `0`, `""`, `[]`, `False`; then a swapped operator, an off-by-one constant; at most
   MAX_MUTANTS of them), or one of the problem's own known-wrong programs where the data has them
   (CodeContests' incorrect_solutions, at most MAX_KNOWN_WRONG, tried first). A function's mutant
   answers a call with the correct program's result wherever it would raise or return another type
   (`typed`), so it differs from the correct program only in a value of the right type: a test that
   checks only the type or that a result exists (`assert isinstance(f(x), int)`, `is not None`)
   fails none of them and earns nothing, alone or bundled with others like it.

Mutants run in rounds, cheapest first (the empty body kills most real tests), each round only on
the tests that no earlier mutant failed, so a real test costs about two sandbox runs.
"""
from __future__ import annotations

import ast
import functools
import re


MAX_MUTANTS = 6
MAX_KNOWN_WRONG = 3  # a problem's own known-wrong programs, tried before its mutants
MUTANT_WALL_S = 5.0  # a mutant that loops counts as failed; no need to wait the full test limit for it

_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
          ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
_CMPOP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
          ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BOOLOP = {ast.And: ast.Or, ast.Or: ast.And}


def _sites(tree: ast.AST) -> list[ast.AST]:
    """Nodes a point mutation can change, in a fixed order (ast.walk's)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP:
            out.append(node)
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in _CMPOP:
            out.append(node)
        elif isinstance(node, ast.BoolOp):
            out.append(node)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append(node)
    return out


def _mutate(node: ast.AST) -> None:
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = _BINOP[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops = [_CMPOP[type(node.ops[0])](), *node.ops[1:]]
    elif isinstance(node, ast.BoolOp):
        node.op = _BOOLOP[type(node.op)]()
    else:
        node.value += 1  # off by one


@functools.lru_cache(maxsize=4096)
def mutants(program: str, kind: str, entry: str = "", max_mutants: int = MAX_MUTANTS) -> tuple[str, ...]:
    """Up to max_mutants wrong versions of a correct program, the structural ones first (a stdin
    program: no output, then printing 0; a function: the empty value of its result's type), then point
    mutations at sites spread evenly over the program. Deterministic; cached per program."""
    name = entry or "solution"
    if kind == "io":
        structural = ["pass\n", "print(0)\n"]
    else:  # the empty value of the result's type (0, "", [], False)
        structural = [f"{program}\n\n_correct_{name} = {name}\n\n\ndef {name}(*args, **kwargs):\n"
                      f"    return type(_correct_{name}(*args, **kwargs))()\n"]
    out = structural[:max_mutants]
    try:
        n_sites = len(_sites(ast.parse(program)))
    except (SyntaxError, ValueError):
        n_sites = 0
    want = max_mutants - len(out)
    picks = sorted({round(i * (n_sites - 1) / max(want - 1, 1)) for i in range(min(want, n_sites))})
    for i in picks:
        tree = ast.parse(program)
        _mutate(_sites(tree)[i])
        try:
            text = ast.unparse(tree) + "\n"
        except (ValueError, TypeError):
            continue
        if text not in out:
            out.append(text)
    out = out[:max_mutants]
    return tuple(out if kind == "io" else (typed(program, m, name) for m in out))


CALL_S = 0.5  # a typed mutant's call that takes longer (a loop the mutation made endless) answers correctly,
# and so do its later calls (one such wait per test run, whatever the test calls)


def typed(program: str, mutant: str, name: str) -> str:
    """`mutant` whose entry point `name` returns the correct program's result wherever the mutant's own
    call would raise, run past CALL_S or return a value of another type (and the correct program itself
    where the mutant does not load): a wrong program of the right result type."""
    return f"""import copy as _copy
import signal as _signal

_correct, _mutant = {{}}, {{}}
exec({program!r}, _correct)
try:
    exec({mutant!r}, _mutant)
except Exception:
    _mutant = _correct


def _too_long(*_):
    raise TimeoutError


_looped = []


def {name}(*args, **kwargs):
    expected = _correct[{name!r}](*_copy.deepcopy(args), **_copy.deepcopy(kwargs))
    if _looped:
        return expected
    before = _signal.signal(_signal.SIGALRM, _too_long)
    _signal.setitimer(_signal.ITIMER_REAL, {CALL_S})
    try:
        got = _mutant[{name!r}](*args, **kwargs)
    except TimeoutError:
        _looped.append(True)
        return expected
    except Exception:
        return expected
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, before)
    return got if type(got) is type(expected) else expected
"""


def entry_point(problem) -> str:
    """The function a function-style problem's tests call: HumanEval's `check(NAME)`, else the
    first function called in its first assert ("" when none is found)."""
    if problem.kind != "function" or not problem.tests:
        return ""
    found = re.search(r"check\((\w+)\)\s*$", problem.tests[0])
    if found:
        return found.group(1)
    names = _called(problem.tests[0])
    return names[0] if names else ""


def _called(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    return [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]


def degenerate(kind: str, test, entry: str) -> str:
    """Why a generated test can earn nothing whatever it runs against ("" when it may)."""
    if kind == "io":
        return "" if str(test[1]).strip() else "empty expected output"
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return "not Python"
    asserts = [n for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    if not asserts:
        return "no assert"
    for a in asserts:
        if not any(isinstance(n, (ast.Name, ast.Call, ast.Attribute)) for n in ast.walk(a.test)):
            return "asserts a constant"
        if entry and entry not in _called(ast.unparse(a.test)):
            return "never calls the entry point"
        if isinstance(a.test, ast.Compare):
            sides = [ast.dump(x) for x in (a.test.left, *a.test.comparators)]
            if any(x == y for x, y in zip(sides, sides[1:])):
                return "compares a value with itself"
    return ""
