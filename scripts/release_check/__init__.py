"""Independent release checks (issue 40): each release's own code, run from a checkout the user
gives, against dlmpipe on tiny checkpoints in the release's format, compared per forward (rows
computed), per step (positions committed, their tokens) and final tokens. Not part of dlmpipe
(nothing in dlmpipe imports it); entry point run.sh, how-to in docs/METHODS.md "The decode trace".

Modules: cases (the grids, prompts), checkpoints (tiny checkpoints, main venv), release_* (the
release side, a release venv), dlm_side (dlmpipe's side, main venv), compare (the table).
Every side writes a JSON list of {"case", "records", "final", "error"}; records have the shape of
dlmpipe's decode trace (dlmpipe/trace.py): {"forward", "kind", "rows", "full", "committed":
[{"pos", "token", "confidence", "prev"}]} (the release side adds "prev", the token it replaced).
"""
