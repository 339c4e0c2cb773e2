"""Measure candidate segmenters for the ``.cjk`` sub-fields on a case set (default: the
multilingual one) and on the paper's set, side by side: ``python -m evals.cjk_candidates``.

Each candidate is the production beliefs index with only the ``tenure_cjk_words`` tokenizer
swapped (evals/backends.py ``CJK_TOKENIZERS``); recall is the API's context builder (``bm25``'s, over a
store without write versions: nothing is cached between recalls).
``icu-without-ko`` is production without the Korean ``.ko`` clauses (ICU alone for Korean). The
figures and the choice are recorded in index_templates/README.md.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

from evals.backends import CJK_TOKENIZERS, CJK_VARIANT_PREFIX, BackendSpec, make_backend, prepare_namespace
from evals.cases import MULTILINGUAL_DIR, load_case_set, paper_case_set
from evals.runner import run_case_set
from service.config import Settings
from service.storage import queries
from service.storage.client import build_client
from service.storage.templates import drop_namespace

WITHOUT_KO = "-without-ko"


def _without_korean(text: str) -> list[dict[str, Any]]:
    return queries.relevance_clauses(text, korean=False)


def candidate_spec(candidate: str) -> BackendSpec:
    """A tokenizer swapped into ``.cjk``; ``<tokenizer>-without-ko``: the same, and Korean text
    searched on the ``.cjk`` clauses only (no ``.ko`` sub-field clauses: ICU alone for Korean)."""
    tokenizer = candidate.removesuffix(WITHOUT_KO)
    clauses = _without_korean if candidate.endswith(WITHOUT_KO) else None
    return BackendSpec(f"cjk-{candidate}", candidate, index_variant=CJK_VARIANT_PREFIX + tokenizer, clauses=clauses)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.cjk_candidates", description=__doc__)
    p.add_argument("--cases", type=Path, default=MULTILINGUAL_DIR)
    p.add_argument("--opensearch-url", default=None)
    p.add_argument("--candidates", default=",".join([*CJK_TOKENIZERS, f"icu{WITHOUT_KO}"]))
    args = p.parse_args(argv)
    settings = Settings()
    if args.opensearch_url:
        settings = settings.model_copy(update={"opensearch_url": args.opensearch_url})
    client = build_client(settings)
    sets = [load_case_set(args.cases), paper_case_set()]
    print("| candidate | " + " | ".join(f"{s.name} passed | failed cases" for s in sets) + " |")
    print("|---|" + "---|---|" * len(sets))
    for candidate in args.candidates.split(","):
        spec = candidate_spec(candidate)
        cells = []
        for case_set in sets:
            namespace = f"cjkc-{uuid.uuid4().hex[:8]}"
            try:
                store = prepare_namespace(client, namespace, spec, settings.recall, None)
                run = run_case_set(
                    case_set,
                    make_backend(spec, store, settings.recall),
                    store,
                    static_tenant="static",
                    session_tenant="session",
                )
            finally:
                drop_namespace(client, namespace)
            failed = [v.case_id for v in run.verdicts if not v.passed]
            cells.append(f"{run.passed}/{run.total} | {', '.join(failed) or '-'}")
        print(f"| `{candidate}` | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
