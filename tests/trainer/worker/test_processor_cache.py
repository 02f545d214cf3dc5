"""The processor's node-local copy (trainer/worker/processor_cache.py): a worker after the node's first loads the
pickled processor instead of the model's files, and gets a processor that encodes the same; a changed file is a
new copy; a copy that does not load is set aside; a copy another user or group could have written is never
unpickled (a pickle runs code): not through a link (the copy or its directory), a swap after a check, a second
hard link, a directory others may write, or another uid's (real chown as root, no mocked stat)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from trainer.worker.processor_cache import CACHE_DIR, WEIGHT_SUFFIXES, cache_key, load_processor

CHAT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe <b>this</b> \u00e9 item\n\n"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A red  chair, 3 legs."}]}]


@pytest.fixture
def model_dir(tiny_model: Path, tmp_path: Path) -> Path:
    """The tiny Gemma 3's processor files, in a directory this test may change (the weights are left out)."""
    out = tmp_path / "model"
    out.mkdir()
    for path in tiny_model.iterdir():
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy(path, out / path.name)
    return out


@pytest.fixture
def from_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each AutoProcessor.from_pretrained call (a load from the model's files), by directory."""
    from transformers import AutoProcessor

    original, calls = AutoProcessor.from_pretrained, []

    def counted(path, *args, **kwargs):
        calls.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(AutoProcessor, "from_pretrained", counted)
    return calls


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """AutoProcessor.from_pretrained replaced by a small picklable record of the call (a stand-in for the 5 s load
    where a test is about the copy, not the processor), and the calls."""
    from transformers import AutoProcessor

    calls: list[str] = []

    def loaded(path, *args, **kwargs):
        calls.append(str(path))
        return {"processor of": str(path), "load": len(calls)}

    monkeypatch.setattr(AutoProcessor, "from_pretrained", loaded)
    return calls


def encoded(processor) -> tuple:
    text = processor.apply_chat_template(CHAT, tokenize=False)
    return text, processor.tokenizer(text).input_ids, processor.image_processor.to_dict()


def copy_path(cache: Path, model_dir: Path) -> Path:
    return cache / CACHE_DIR / f"{cache_key(model_dir)}.pkl"


def test_the_nodes_second_load_is_its_copy_and_encodes_the_same(model_dir, tmp_path, from_files) -> None:
    cache = tmp_path / "cache"
    first = load_processor(model_dir, cache)
    assert from_files == [str(model_dir)]
    copy = copy_path(cache, model_dir)
    assert copy.is_file() and copy.stat().st_mode & 0o777 == 0o600
    second = load_processor(model_dir, cache)
    assert from_files == [str(model_dir)], "the second load read the files again"
    assert second is not first and encoded(second) == encoded(first)
    assert second.chat_template == first.chat_template and second.image_token_id == first.image_token_id


def test_a_changed_file_is_a_new_copy(model_dir, tmp_path, stand_in) -> None:
    cache = tmp_path / "cache"
    assert load_processor(model_dir, cache)["load"] == 1
    assert load_processor(model_dir, cache)["load"] == 1  # the copy
    before = cache_key(model_dir)
    config = model_dir / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"padding_side": "right"', '"padding_side": "left"'))
    assert cache_key(model_dir) != before
    assert load_processor(model_dir, cache)["load"] == 2 and stand_in == [str(model_dir)] * 2
    assert len(list((cache / CACHE_DIR).glob("*.pkl"))) == 2
    after = cache_key(model_dir)
    (model_dir / "model.safetensors").write_bytes(b"weights")  # not part of the name: only the processor's files
    assert cache_key(model_dir) == after


def test_a_copy_that_does_not_load_is_set_aside_and_made_again(model_dir, tmp_path, stand_in) -> None:
    cache = tmp_path / "cache"
    copy = copy_path(cache, model_dir)
    copy.parent.mkdir(parents=True)
    copy.write_bytes(b"\x80\x05torn")
    copy.chmod(0o600)
    processor = load_processor(model_dir, cache)
    assert stand_in == [str(model_dir)]
    assert pickle.loads(copy.read_bytes()) == processor


class Payload:
    """What a planted pickle could do: here, leave a file behind when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666], ids=oct)
def test_a_copy_others_could_write_is_never_unpickled(model_dir, tmp_path, stand_in, mode: int) -> None:
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    copy = copy_path(cache, model_dir)
    copy.parent.mkdir(parents=True)
    copy.write_bytes(pickle.dumps(Payload(marker)))
    copy.chmod(mode)
    processor = load_processor(model_dir, cache)
    assert not marker.exists(), "the planted pickle was loaded"
    assert stand_in == [str(model_dir)] and processor["load"] == 1
    # The check is what kept it out: the same bytes at 0600 are loaded. This is also the rule's limit (the same-uid
    # volume): a file this uid wrote, alone in this uid's directory, is trusted; the cache must sit where only this
    # uid writes (processor_cache's docstring, trainer/README.md).
    copy.write_bytes(pickle.dumps(Payload(marker)))
    copy.chmod(0o600)
    load_processor(model_dir, cache)
    assert marker.exists(), "the private copy was not loaded"


def test_a_link_in_the_copys_place_is_never_followed(model_dir, tmp_path, stand_in) -> None:
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    planted = tmp_path / "planted.pkl"
    planted.write_bytes(pickle.dumps(Payload(marker)))
    planted.chmod(0o600)
    copy = copy_path(cache, model_dir)
    copy.parent.mkdir(parents=True)
    os.symlink(planted, copy)
    load_processor(model_dir, cache)
    assert not marker.exists() and stand_in == [str(model_dir)]


def plant(cache: Path, model_dir: Path, marker: Path, mode: int = 0o600) -> Path:
    """A pickle that leaves `marker` when loaded, in the copy's place, this user's, mode `mode`."""
    copy = copy_path(cache, model_dir)
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(pickle.dumps(Payload(marker)))
    copy.chmod(mode)
    return copy


def test_a_swap_between_the_check_and_the_open_is_never_followed(model_dir, tmp_path, stand_in, monkeypatch) -> None:
    """The copy is genuine when it is checked, then replaced by a link to a planted pickle before it is opened (the
    swap is made at whichever comes first of the two: an lstat of the copy's path, an os.open of its name)."""
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    copy = copy_path(cache, model_dir)
    copy.parent.mkdir(parents=True, mode=0o700)
    copy.write_bytes(pickle.dumps({"processor of": "the genuine copy"}))
    copy.chmod(0o600)
    planted = tmp_path / "planted.pkl"
    planted.write_bytes(pickle.dumps(Payload(marker)))
    planted.chmod(0o600)
    swapped: list[bool] = []

    def swap() -> None:
        if not swapped:
            swapped.append(True)
            copy.unlink()
            os.symlink(planted, copy)

    real_lstat, real_open = Path.lstat, os.open

    def lstat(self, *args, **kwargs):
        result = real_lstat(self, *args, **kwargs)
        if self == copy:
            swap()
        return result

    def os_open(path, *args, **kwargs):
        if os.fspath(path).endswith(copy.name):
            swap()
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(Path, "lstat", lstat)
    monkeypatch.setattr(os, "open", os_open)
    processor = load_processor(model_dir, cache)
    assert swapped, "the copy was never looked at"
    assert not marker.exists(), "the link swapped in after the check was followed and its pickle loaded"
    assert stand_in == [str(model_dir)] and processor["load"] == 1


def test_a_copy_with_a_second_hard_link_is_never_unpickled(model_dir, tmp_path, stand_in) -> None:
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    copy = plant(cache, model_dir, marker)
    os.link(copy, tmp_path / "elsewhere.pkl")  # its bytes can change through a name outside the cache
    load_processor(model_dir, cache)
    assert not marker.exists() and stand_in == [str(model_dir)]


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777], ids=oct)
def test_a_processors_directory_others_could_write_is_never_used(model_dir, tmp_path, stand_in, mode: int) -> None:
    """In a directory others may write, a copy can be renamed in whole (a file this user wrote, swapped): none of it
    is read, and nothing is written there."""
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    copy = plant(cache, model_dir, marker)
    copy.parent.chmod(mode)
    assert load_processor(model_dir, cache)["load"] == 1 and load_processor(model_dir, cache)["load"] == 2
    assert not marker.exists() and stand_in == [str(model_dir)] * 2
    assert list(copy.parent.iterdir()) == [copy]


def test_a_processors_directory_that_is_a_link_is_never_followed(model_dir, tmp_path, stand_in) -> None:
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    elsewhere = tmp_path / "elsewhere"
    plant(elsewhere, model_dir, marker)
    (cache).mkdir()
    os.symlink(elsewhere / CACHE_DIR, cache / CACHE_DIR)  # a link to a directory (another user's, or this one's)
    load_processor(model_dir, cache)
    assert not marker.exists() and stand_in == [str(model_dir)]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root (this runs as root in CI)")
@pytest.mark.parametrize("what", ["directory", "file"])
def test_a_directory_or_copy_of_another_uid_is_never_used(model_dir, tmp_path, stand_in, what: str) -> None:
    """Real ownership (os.chown to another uid, as root), not a mocked stat."""
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    copy = plant(cache, model_dir, marker)
    os.chown(copy.parent if what == "directory" else copy, 54321, 54321)
    load_processor(model_dir, cache)
    assert not marker.exists() and stand_in == [str(model_dir)]
