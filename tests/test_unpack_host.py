"""scripts/unpack_host.py with a real git store that lacks a blob (as a fetched snapshot lacks its
largest files): the file is left out and recorded with its blob id; `where` names it and says
whether its stand-in is there; once the stand-in is there, `fill` writes it (and only when the
stand-in's blob id is the tree's)."""

import importlib.util
import os
import subprocess

import pytest

from comfy_server import REPO_ROOT

spec = importlib.util.spec_from_file_location("unpack_host", REPO_ROOT / "scripts" / "unpack_host.py")
unpack_host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unpack_host)

TOKENIZER = b'{"model": "a tokenizer the store lacks"}\n'


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A git store holding a commit whose tokenizer blob is gone, and a host entry for it whose
    stand-in (not there yet) is tmp_path/stand_in/tokenizer.json."""
    repo = tmp_path / "repo"
    (repo / "tok").mkdir(parents=True)
    (repo / "version.py").write_text('__version__ = "9.9"\n')
    (repo / "tok" / "tokenizer.json").write_bytes(TOKENIZER)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "host")
    commit = git(repo, "rev-parse", "HEAD")
    oid = git(repo, "rev-parse", "HEAD:tok/tokenizer.json")
    os.remove(repo / ".git" / "objects" / oid[:2] / oid[2:])   # the store now lacks that blob
    stand_in = tmp_path / "stand_in" / "tokenizer.json"
    monkeypatch.setenv("VIKING_HOSTS", str(tmp_path / "hosts"))
    monkeypatch.setattr(unpack_host, "HOSTS", {"testhost": {
        "folder": "TestHost", "repository": "example/testhost", "commit": commit,
        "stand_ins": {"tok/tokenizer.json": lambda: stand_in}, "check": ("version.py", "9.9")}})
    return repo / ".git", stand_in, oid


def test_left_out_file_is_named_and_filled_once_its_stand_in_is_there(host, capsys):
    git_dir, stand_in, oid = host
    dest = unpack_host.unpack("testhost", str(git_dir))
    assert (dest / "version.py").exists() and not (dest / "tok" / "tokenizer.json").exists()
    capsys.readouterr()

    unpack_host.where()
    assert f"left out: tok/tokenizer.json (its stand-in {stand_in} is not there yet)" in capsys.readouterr().out

    stand_in.parent.mkdir()
    stand_in.write_bytes(b"another version\n")
    unpack_host.where()
    assert f"{stand_in} is another version of it" in capsys.readouterr().out
    unpack_host.fill()
    assert "still left out" in capsys.readouterr().out and not (dest / "tok" / "tokenizer.json").exists()

    stand_in.write_bytes(TOKENIZER)
    unpack_host.where()
    assert "is there now: python3 scripts/unpack_host.py fill" in capsys.readouterr().out
    unpack_host.fill()
    assert "wrote tok/tokenizer.json" in capsys.readouterr().out
    assert (dest / "tok" / "tokenizer.json").read_bytes() == TOKENIZER
    unpack_host.where()
    assert "left out" not in capsys.readouterr().out
