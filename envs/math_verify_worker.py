"""A long-lived worker process that runs math_verify for `math_grading`.

Run as a script; reads one JSON line per request and writes one line: for
`[pred, reference]`, `1` (equal), `0` (not equal) or `-` (math_verify could not
decide); for `{"extract": text}`, the answer math_verify's parse finds anywhere
in the text as a JSON string, or `-` for none; for `{"as_written": [a, b]}`,
`verify(parse(a), parse(b))` on the texts as given, nothing wrapped (`1`/`0`).
math_verify's own timeouts use signal.alarm, which fails off the main thread
and cannot stop long C-level big-integer arithmetic (e.g. 9^(9^9)); so they
are disabled here and the parent kills this process when an answer takes too
long. Keep it free of project imports: it starts with `python -I <this file>`.
"""
import json
import logging
import sys


def _wrap(text: str) -> str:
    """math_verify finds LaTeX inside math delimiters; bare answers get `$...$`."""
    if any(mark in text for mark in ("$", "\\boxed", "\\(", "\\[")):
        return text
    return f"${text}$"


MEMORY_LIMIT_BYTES = 4 << 30  # a hostile answer (e.g. factorial(10**8)) fails here, not in the host


def main() -> None:
    logging.disable(logging.CRITICAL)  # math_verify warns on every call when timeouts are off
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    from math_verify import parse, verify

    for line in sys.stdin:
        try:
            request = json.loads(line)
            if isinstance(request, dict) and "as_written" in request:  # the reference's verify(parse(a), parse(b))
                gold_text, target_text = request["as_written"]
                gold, target = parse(gold_text, parsing_timeout=None), parse(target_text, parsing_timeout=None)
                sys.stdout.write(("1" if verify(gold, target, timeout_seconds=None) else "0") + "\n")
                sys.stdout.flush()
                continue
            if isinstance(request, dict):
                found = parse(request["extract"], parsing_timeout=None)
                sys.stdout.write((json.dumps(str(found[-1])) if found else "-") + "\n")
                sys.stdout.flush()
                continue
            pred, reference = request
            gold = parse(_wrap(reference), parsing_timeout=None)
            guess = parse(_wrap(pred), parsing_timeout=None)
            if not gold or not guess:
                answer = "-"
            else:
                answer = "1" if verify(gold, guess, timeout_seconds=None) else "0"
        except Exception:  # noqa: BLE001 - any failure (MemoryError included) means "undecided"
            answer = "-"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
