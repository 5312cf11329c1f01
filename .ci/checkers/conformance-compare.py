"""Compares two runs of the MCP conformance suite: each scenario on a session of its own, and the
whole suite on one session. A server whose sessions carry nothing from one MCP client to the next
gives the same outcome to every check in both; a difference is state leaking between clients
(a JSON-RPC request id taken for a session's call id: issue 23 §1).

Usage: conformance-compare.py EACH_DIR ONE_DIR  (the -o directories of the two runs)
"""
import json
import pathlib
import re
import sys

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
STAMP = re.compile(r"-\d{4}-\d\d-\d\dT[\d-]+Z$")


def outcomes(root):
    by_scenario = {}
    for checks in sorted(pathlib.Path(root).glob("server-*/checks.json")):
        scenario = STAMP.sub("", checks.parent.name)[len("server-"):]
        rows = []
        for c in json.loads(checks.read_text()):
            if c.get("status") in ("SUCCESS", "FAILURE", "WARNING"):
                message = UUID.sub("<uuid>", c.get("errorMessage") or "")
                rows.append((c.get("id"), c["status"], message))
        by_scenario[scenario] = rows
    return by_scenario


each, one = outcomes(sys.argv[1]), outcomes(sys.argv[2])
problems = []
if sorted(each) != sorted(one):
    problems.append(f"scenarios differ: each {sorted(each)} / one session {sorted(one)}")
for scenario in sorted(set(each) & set(one)):
    if each[scenario] != one[scenario]:
        problems.append(
            f"{scenario}:\n  on a session of its own: {each[scenario]}\n  after the others on one session: {one[scenario]}"
        )
reused = [p for p in problems if "already used in this session" in p]
if reused:
    print(
        "FAIL: on one session, a client's JSON-RPC request id was taken for a call id the session "
        "had seen before (issue 23 §1):",
        file=sys.stderr,
    )
if problems:
    print("FAIL: the whole suite on one session differs from each scenario on its own:", file=sys.stderr)
    for p in problems:
        print(p, file=sys.stderr)
    sys.exit(1)
print(f"== the same outcomes on one session as on one session each ({len(each)} scenarios)")
