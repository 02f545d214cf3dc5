"""`gemma3-ray data shard` against fake-gcs-server (the real Go server): plan by default, shards and a manifest with
--apply that the trainer's manifest check accepts, resume after an interrupt, a damaged or missing shard named in
one sentence, a schema that does not match refused before anything is written."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients
from gemma3_ray.gcp import data_shards

from tests.plugin.conftest import PROJECT, REGION, Recorder, storage_client
from trainer.job import shard_manifest

BUCKET = "datasets-bucket"
TO = f"gs://{BUCKET}/shards/products"


def _png(i: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8 + i % 5, 8), (i * 7 % 256, 40, 90)).save(buf, format="PNG")
    return buf.getvalue()


def _source(tmp_path: Path, n: int = 30, name: str = "products.parquet") -> Path:
    rows = [{"Product Name": f"p{i}", "Category": "c", "image": {"bytes": _png(i), "path": f"{i}.png"},
             "description": f"d{i}"} for i in range(n)]
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def gcs(fake_gcs_factory):
    url = fake_gcs_factory(REGION)
    storage = storage_client(url)
    storage.create_bucket(BUCKET)
    return url, storage


def _run(args: list[str], storage, capsys) -> tuple[int, str, str]:
    rc = cli.main(["data", "shard", *args], Clients(project=PROJECT, storage=storage))
    out, err = capsys.readouterr()
    return rc, out, err


def _objects(storage) -> dict[str, bytes]:
    return {b.name: b.download_as_bytes() for b in storage.list_blobs(BUCKET)}


def _gcs_fs(url: str):
    import pyarrow.fs as pafs

    scheme, _, host = url.rpartition("://")
    return pafs.GcsFileSystem(anonymous=True, endpoint_override=host, scheme=scheme)


def test_plan_writes_nothing_and_apply_round_trips_with_a_manifest_the_trainer_accepts(gcs, tmp_path, capsys):
    url, storage = gcs
    src = _source(tmp_path)
    rc, out, _ = _run([str(src), "--to", TO, "--shard-size", "500B"], storage, capsys)
    assert rc == 0 and "Dry run: nothing changed (nothing written)" in out and "30 rows" in out
    assert _objects(storage) == {}

    rc, out, err = _run([str(src), "--to", TO, "--shard-size", "500B", "--apply"], storage, capsys)
    assert rc == 0, err
    assert "Done: 30 rows in" in out and "30/30 rows" in err  # the progress bar (a line per shard off a terminal)
    objects = _objects(storage)
    manifest = json.loads(objects["shards/products/manifest.json"])
    assert manifest["rows"] == 30 and len(manifest["shards"]) > 2
    assert "shards/products/_shard_progress.json" not in objects
    # Every row back, in order, with its index and its image bytes.
    back = []
    for shard in manifest["shards"]:
        table = pq.read_table(pa.BufferReader(objects[f"shards/products/{shard['name']}"]))
        assert table.num_rows == shard["rows"]
        back += table.to_pylist()
    original = pq.read_table(src).to_pylist()
    assert [r["_row"] for r in back] == list(range(30))
    assert [{k: v for k, v in r.items() if k != "_row"} for r in back] == original
    # The trainer's head-side check reads the same manifest and verifies every shard's size and md5.
    checked = shard_manifest.load(_gcs_fs(url), f"{BUCKET}/shards/products", TO, True,
                                  {"image": "image", "answer": "description", "product": "Product Name"})
    assert checked.rows == 30 and checked.uris()[0] == f"{TO}/shard-00000.parquet"

    rc, out, _ = _run([str(src), "--to", TO, "--shard-size", "500B"], storage, capsys)
    assert rc == 0 and "Nothing to do: the dataset is sharded" in out


def test_an_interrupted_apply_resumes_at_the_next_shard(gcs, tmp_path, capsys, monkeypatch):
    url, storage = gcs
    src = _source(tmp_path)
    calls = {"n": 0}
    real_put = data_shards.GcsDestination.put_file

    def interrupted(self, name, local):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        real_put(self, name, local)

    monkeypatch.setattr(data_shards.GcsDestination, "put_file", interrupted)
    rc, _, err = _run([str(src), "--to", TO, "--shard-size", "500B", "--apply"], storage, capsys)
    assert rc == 1 and "interrupted" in err
    assert "shards/products/manifest.json" not in _objects(storage)
    monkeypatch.setattr(data_shards.GcsDestination, "put_file", real_put)

    rc, out, _ = _run([str(src), "--to", TO, "--shard-size", "500B"], storage, capsys)
    assert rc == 0 and "2 shards already written" in out
    recorder = Recorder()
    resumed = storage_client(url, recorder)
    rc, out, _ = _run([str(src), "--to", TO, "--shard-size", "500B", "--apply"], resumed, capsys)
    assert rc == 0
    uploads = [u for m, u in recorder.mutations() if "shard-0000" in u]
    assert not any("shard-00000" in u or "shard-00001" in u for u in uploads)  # the two done shards were kept
    resumed_manifest = json.loads(_objects(storage)["shards/products/manifest.json"])

    # The same bytes as an uninterrupted run.
    whole = f"gs://{BUCKET}/shards/whole"
    assert _run([str(src), "--to", whole, "--shard-size", "500B", "--apply"], storage, capsys)[0] == 0
    whole_manifest = json.loads(_objects(storage)["shards/whole/manifest.json"])
    assert [s["sha256"] for s in resumed_manifest["shards"]] == [s["sha256"] for s in whole_manifest["shards"]]


def test_a_damaged_or_missing_shard_is_one_sentence_naming_it(gcs, tmp_path, capsys):
    url, storage = gcs
    src = _source(tmp_path)
    assert _run([str(src), "--to", TO, "--shard-size", "500B", "--apply"], storage, capsys)[0] == 0
    bucket = storage.bucket(BUCKET)
    blob = bucket.blob("shards/products/shard-00001.parquet")
    data = bytearray(blob.download_as_bytes())
    data[100] ^= 0xFF  # a bit flip: same size, another md5
    blob.upload_from_string(bytes(data))

    rc, _, err = _run([str(src), "--to", TO, "--shard-size", "500B"], storage, capsys)
    assert rc != 0 and "shard-00001.parquet" in err and "md5" in err and "\n" not in err.strip()
    with pytest.raises(shard_manifest.ManifestError, match=r"shard shard-00001\.parquet has another md5"):
        shard_manifest.load(_gcs_fs(url), f"{BUCKET}/shards/products", TO, True)

    bucket.blob("shards/products/shard-00002.parquet").delete()
    with pytest.raises(shard_manifest.ManifestError, match=r"shard shard-00001\.parquet"):
        shard_manifest.load(_gcs_fs(url), f"{BUCKET}/shards/products", TO, True)
    blob.upload_from_string(bytes(data[:-1]))  # cut short
    with pytest.raises(shard_manifest.ManifestError, match=r"shard-00001\.parquet has \d+ bytes"):
        shard_manifest.load(_gcs_fs(url), f"{BUCKET}/shards/products", TO, True)


def test_a_schema_that_does_not_match_is_refused_before_anything_is_written(gcs, tmp_path, capsys):
    _, storage = gcs
    folder = tmp_path / "two"
    folder.mkdir()
    _source(folder, 5, "a.parquet")
    pq.write_table(pa.Table.from_pylist([{"Product Name": "x", "image": {"bytes": b"x", "path": "p"},
                                          "caption": "other"}]), folder / "b.parquet")
    rc, _, err = _run([str(folder), "--to", TO, "--apply"], storage, capsys)
    assert rc == 2 and "b.parquet has another schema than a.parquet" in err
    rc, _, err = _run([str(folder / "a.parquet"), "--to", TO, "--apply", "--image-column", "photo"], storage, capsys)
    assert rc == 2 and "no image column 'photo'" in err and "--image-column" in err
    assert _objects(storage) == {}
    # The trainer refuses a run whose mapping names a column the shards lack, before any worker.
    assert _run([str(folder / "a.parquet"), "--to", TO, "--apply"], storage, capsys)[0] == 0
    shards = shard_manifest.parse(_objects(storage)["shards/products/manifest.json"], TO)
    with pytest.raises(shard_manifest.ManifestError, match=r"missing column\(s\) 'caption' \(for answer\)"):
        shard_manifest.check_columns(shards, {"image": "image", "answer": "caption"})


def test_jsonl_with_image_paths_inlines_them_and_keeps_rows_without_one(gcs, tmp_path, capsys):
    _, storage = gcs
    data = tmp_path / "j"
    (data / "img").mkdir(parents=True)
    lines = []
    for i in range(6):
        if i != 3:
            (data / "img" / f"{i}.png").write_bytes(_png(i))
        lines.append(json.dumps({"image": f"img/{i}.png", "description": f"d{i}"}))
    (data / "rows.jsonl").write_text("\n".join(lines) + "\n")
    rc, out, err = _run([str(data / "rows.jsonl"), "--to", TO, "--format", "webdataset", "--apply"], storage, capsys)
    assert rc == 0, err
    assert "1 rows have no image (kept: the trainer counts them as missing_image)" in out
    objects = _objects(storage)
    manifest = json.loads(objects["shards/products/manifest.json"])
    assert manifest["shard_format"] == "webdataset" and manifest["rows"] == 6
    with tarfile.open(fileobj=io.BytesIO(objects["shards/products/shard-00000.tar"])) as tar:
        names = tar.getnames()
        assert "0000000000.png" in names and "0000000003.missing" in names
        meta = json.loads(tar.extractfile("0000000002.json").read())
        assert meta == {"description": "d2", "_row": 2, "image_path": "img/2.png"}
        assert tar.extractfile("0000000002.png").read() == _png(2)


def test_the_plan_works_without_credentials(tmp_path, capsys, monkeypatch):
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    src = _source(tmp_path, 4)
    assert cli.main(["data", "shard", str(src), "--to", TO]) == 0
    out = capsys.readouterr().out
    assert "4 rows" in out and "not logged in" in out and "Dry run: nothing checked or changed" in out
    assert cli.main(["data", "shard", str(src), "--to", TO, "--apply"]) == 1
    assert "gcloud auth application-default login" in capsys.readouterr().err


def test_a_bad_shard_size_is_one_sentence(tmp_path, capsys):
    src = _source(tmp_path, 2)
    assert cli.main(["data", "shard", str(src), "--to", TO, "--shard-size", "lots"]) == 2
    assert "--shard-size 'lots': give a size such as 256MB" in capsys.readouterr().err


def test_a_jsonl_is_typed_from_every_line_and_drift_is_one_sentence(tmp_path, capsys):
    """A column whose type changes after line 1 was an ArrowInvalid 'internal error … this is a bug' mid-write;
    int and float mix as double, a null takes the column's type; string after a number is refused before a write."""
    (tmp_path / "a.png").write_bytes(_png(1))
    rows = [{"image": "a.png", "description": "d0", "price": 3, "note": None},
            {"image": "a.png", "description": "d1", "price": 3.5, "note": "n"}]
    (tmp_path / "ok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["data", "shard", str(tmp_path / "ok.jsonl"), "--to", str(tmp_path / "ok"), "--apply"]) == 0
    assert pq.read_table(tmp_path / "ok" / "shard-00000.parquet").column("price").to_pylist() == [3.0, 3.5]
    capsys.readouterr()
    rows.append({"image": "a.png", "description": "d2", "price": "n/a"})
    (tmp_path / "drift.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = cli.main(["data", "shard", str(tmp_path / "drift.jsonl"), "--to", str(tmp_path / "drift"), "--apply"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.endswith(f"{tmp_path / 'drift.jsonl'}: column 'price' is double on line 2 and string "
                                    "on line 3; give a column one type on every line"), err
    assert "\n" not in err and not (tmp_path / "drift").exists()
