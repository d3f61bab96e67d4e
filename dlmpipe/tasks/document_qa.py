"""Questions over a document as task rows: PubMedQA (an abstract) and FinQA (a financial report).

- PubMedQA: the expert-labelled set ``ori_pqal.json`` (PMID -> ``QUESTION``, ``CONTEXTS``,
  ``final_decision``; 1,000 questions; ``pubmedqa``) and its 500-question test split
  ``test_ground_truth.json`` (PMID -> label; ``pubmedqa_test``, questions from ``base_source``,
  the ori_pqal file). ``label`` tasks over yes/no/maybe. Prompt: lm-evaluation-harness's layout
  ("Abstract: {contexts}\\nQuestion: {question}\\n") with the request "Answer with yes, no or
  maybe." (Archer: a yes/no/maybe decision after reading the question and abstract).
- FinQA: the release's ``test.json`` (1,147 records: ``pre_text``, ``table``, ``post_text``,
  ``qa.question``, ``qa.exe_ans``). ``number`` tasks against ``exe_ans`` (FinQA's tolerance,
  dlmpipe/scoring/answers.py ``finqa_equal``), or ``label`` tasks for its yes/no answers. Prompt:
  the report (text, the table as ``|``-separated rows, text), the question and "Please reason
  step by step, and finish with "The answer is" and the number." (Archer: a numerical answer
  from a financial report and table, compared with ``exe_ans``).
"""
from __future__ import annotations

import json
from pathlib import Path

from .spec import Benchmark, DataFile, counted
from .sources import read_json, read_records, require, resolve_source

PUBMEDQA_INSTRUCTION = "Abstract: {context}\nQuestion: {question}\nAnswer with yes, no or maybe."
PUBMEDQA_LABELS = ["yes", "no", "maybe"]
FINQA_INSTRUCTION = ("{report}\n\nQuestion: {question}\nPlease reason step by step, and finish "
                     "with \"The answer is\" and the number.")


def load_pubmedqa(source: str | None = None) -> list[dict]:
    """The 1,000 expert-labelled PubMedQA questions."""
    src = resolve_source("pubmedqa", source)
    return [_pubmedqa_row(pmid, r, r["final_decision"])
            for pmid, r in _pubmedqa_questions("pubmedqa", src).items()]


def load_pubmedqa_test(source: str | None = None, base_source: str | None = None) -> list[dict]:
    """PubMedQA's 500-question test split: the labels of ``source``, the questions of
    ``base_source`` (ori_pqal)."""
    src = resolve_source("pubmedqa_test", source)
    truth = read_json("pubmedqa_test", src)
    if not isinstance(truth, dict) or not all(v in PUBMEDQA_LABELS for v in truth.values()):
        raise ValueError(f"pubmedqa_test: malformed data file {src}: expected PMID -> yes/no/maybe")
    base = resolve_source("pubmedqa", base_source, "base_source")
    questions = _pubmedqa_questions("pubmedqa_test", base)
    missing = [pmid for pmid in truth if pmid not in questions]
    if missing:
        raise ValueError(f"pubmedqa_test: {len(missing)} PMIDs of {src} are not in {base} "
                         f"(e.g. {missing[:3]})")
    return [_pubmedqa_row(pmid, questions[pmid], label) for pmid, label in truth.items()]


def load_finqa(source: str | None = None) -> list[dict]:
    """FinQA test split: numeric answers (and a few yes/no ones) against ``exe_ans``."""
    src = resolve_source("finqa", source)
    out = []
    for n, r in enumerate(read_records("finqa", src, "test")):
        require("finqa", src, r, ("pre_text", "table", "post_text", "qa"), n)
        qa = r["qa"]
        if not isinstance(qa, dict) or "question" not in qa or "exe_ans" not in qa:
            raise ValueError(f"finqa: malformed data file {src}: record {n}: qa lacks question/exe_ans")
        answer = qa["exe_ans"]
        if isinstance(answer, str) and answer.strip().lower() in ("yes", "no"):
            kind = {"kind": "label", "answer": answer.strip().lower(), "choices": '["yes", "no"]'}
        else:
            try:
                kind = {"kind": "number", "answer": repr(float(answer))}
            except (TypeError, ValueError):
                raise ValueError(f"finqa: malformed data file {src}: record {n}: exe_ans "
                                 f"{answer!r} is neither a number nor yes/no") from None
        report = "\n".join([_text(r["pre_text"]), _table(r["table"]), _text(r["post_text"])])
        out.append({"task_id": f"finqa/{r.get('id') or n}", **kind,
                    "prompt": FINQA_INSTRUCTION.format(report=report.strip(),
                                                       question=str(qa["question"]).strip()),
                    "code_prefix": "", "test": "", "entry_point": ""})
    return out


def _pubmedqa_questions(task: str, src) -> dict[str, dict]:
    """PMID -> {QUESTION, CONTEXTS, final_decision}: the ori_pqal file, or the dataset id's
    records (``qiaojin/PubMedQA:pqa_labeled``: pubid, question, context.contexts)."""
    if isinstance(src, str):
        return {str(r["pubid"]): {"QUESTION": r["question"], "CONTEXTS": r["context"]["contexts"],
                                  "final_decision": r["final_decision"]}
                for r in read_records(task, src, "train")}
    data = read_json(task, Path(src))
    if not isinstance(data, dict):
        raise ValueError(f"{task}: malformed data file {src}: expected PMID -> question record")
    for pmid, r in data.items():
        require(task, src, r, ("QUESTION", "CONTEXTS", "final_decision"), pmid)
    return {str(k): v for k, v in data.items()}


def _pubmedqa_row(pmid: str, r: dict, label: str) -> dict:
    context = "\n".join(r["CONTEXTS"])
    return {"task_id": f"pubmedqa/{pmid}", "kind": "label", "answer": label,
            "choices": json.dumps(PUBMEDQA_LABELS),
            "prompt": PUBMEDQA_INSTRUCTION.format(context=context, question=r["QUESTION"]),
            "code_prefix": "", "test": "", "entry_point": ""}


def _text(parts) -> str:
    return " ".join(str(p).strip() for p in parts) if isinstance(parts, list) else str(parts)


def _table(rows) -> str:
    return "\n".join("| " + " | ".join(str(c).strip() for c in row) + " |" for row in rows)


BENCHMARKS = (  # PubMedQA's prompt characters measured here, FinQA's estimated
    Benchmark("pubmedqa", load_pubmedqa, (DataFile("source", "pubmedqa"),), 1000, 1486),
    Benchmark("pubmedqa_test", load_pubmedqa_test,
              (DataFile("source", "pubmedqa_test"), DataFile("base_source", "pubmedqa")), 500, 1498),
    Benchmark("finqa", load_finqa, (DataFile("source", "finqa"),), counted(1147), 4000),
)
