//! BPE tokenization: `Tokenizer` round trips, `trainer tokenize` shards read by the shard
//! reader, a tiny train -> sample -> export on BPE data, and the refusals.

mod common;
use common::{stderr, stdout, trainer};

use std::path::{Path, PathBuf};

use trainer::data::tokenizer_shards::{shard_paths, tokenize_files};
use trainer::data::{open_shard, BpeTrainOptions, DataSource, ShardFormat, ShardLayout, Tokenizer};

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("nibble-tok-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, p: &str) -> String {
        self.0.join(p).to_str().unwrap().to_string()
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two text files: the embedded corpus plus a line of non-ASCII text.
fn texts(d: &TempDir) -> Vec<PathBuf> {
    let a = d.0.join("a.txt");
    std::fs::write(&a, trainer::data::generate(1, 60_000)).unwrap();
    let b = d.0.join("b.txt");
    let mut t = trainer::data::generate(2, 20_000);
    t.push_str("\nnaïve café — 日本語, emoji 🦀.\n");
    std::fs::write(&b, t).unwrap();
    vec![a, b]
}

fn train(files: &[PathBuf], vocab: u32) -> Tokenizer {
    let opts = BpeTrainOptions {
        vocab_size: vocab,
        min_frequency: 2,
    };
    Tokenizer::train_bpe(files, &opts).unwrap()
}

#[test]
fn bpe_round_trips_and_is_deterministic() {
    let d = TempDir::new("rt");
    let files = texts(&d);
    let t = train(&files, 400);
    assert_eq!(t.vocab_size(), 400);
    let again = train(&files, 400);
    assert_eq!(t.to_json(), again.to_json(), "training is deterministic");
    for s in [
        "The fox that the children follow sleeps.",
        "naïve café — 日本語, emoji 🦀.",
        "  leading spaces\n\ttabs and \r\n line ends ",
        "",
    ] {
        let ids = t.encode(s).unwrap();
        assert!(ids.iter().all(|&i| i < 400));
        assert_eq!(t.decode(&ids).unwrap(), s);
    }
    // Merges make common text shorter than its bytes.
    let text = trainer::data::generate(3, 5_000);
    let n = t.encode(&text).unwrap().len();
    assert!(n * 2 < text.len(), "{n} tokens for {} bytes", text.len());
    // Parallel batches give the per-text ids.
    let parts = ["one lamp", "three lamps", "Mira said, \"we are here.\""];
    let batch = t.encode_batch(&parts).unwrap();
    for (p, ids) in parts.iter().zip(batch) {
        assert_eq!(ids, t.encode(p).unwrap());
    }
    // The saved JSON loads back to the same tokenizer.
    let p = d.0.join("tokenizer.json");
    std::fs::write(&p, t.to_json()).unwrap();
    let loaded = Tokenizer::from_file(&p).unwrap();
    assert_eq!(loaded.encode(&text).unwrap(), t.encode(&text).unwrap());
    // Ids outside the vocabulary are refused, bytes decode through the byte tokenizer.
    assert!(t.decode(&[400]).is_err());
    assert_eq!(Tokenizer::Bytes.decode(&[104, 105]).unwrap(), "hi");
    assert!(Tokenizer::Bytes.decode(&[256]).is_err());
}

#[test]
fn shards_are_read_by_the_shard_reader() {
    let d = TempDir::new("sh");
    let files = texts(&d);
    let t = train(&files, 300);
    let out = d.0.join("tok");
    // Small shards, to get several.
    let seen = std::sync::Mutex::new(0u64);
    let r = tokenize_files(&files, &t, &out, 20_000, &|b| *seen.lock().unwrap() = b).unwrap();
    let total_bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(r.bytes, total_bytes);
    assert_eq!(*seen.lock().unwrap(), total_bytes);
    assert!(r.shards.len() >= 2, "{r:?}");
    assert_eq!(shard_paths(&out).unwrap(), r.shards);
    let mut all = vec![];
    for p in &r.shards {
        let s = open_shard(p, ShardFormat::Auto, 300).unwrap();
        assert_eq!(s.layout, ShardLayout::LlmC { version: 1 });
        all.extend(s.tokens.iter());
    }
    assert_eq!(all.len() as u64, r.tokens);
    // The ids are the per-file encodings, concatenated; the text comes back.
    let text_a = std::fs::read_to_string(&files[0]).unwrap();
    let text_b = std::fs::read_to_string(&files[1]).unwrap();
    let decoded = t.decode(&all).unwrap();
    assert_eq!(decoded, format!("{text_a}{text_b}"));
    // The folder as a data source: its tokenizer, its vocabulary, the same tokens.
    let src = DataSource::tokenized(&out).unwrap();
    assert_eq!(src.vocab_size(), 300);
    let tokens = src.load().unwrap();
    assert_eq!(tokens.iter().collect::<Vec<_>>(), all);
    let st = src.tokenizer().unwrap().unwrap();
    assert_eq!(st.to_json(), t.to_json());
    // A second run into the same folder is refused and leaves it alone.
    let e = tokenize_files(&files, &t, &out, 20_000, &|_| {}).unwrap_err();
    assert!(e.to_string().contains("not empty"), "{e}");
    assert_eq!(shard_paths(&out).unwrap(), r.shards);
}

#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let d = TempDir::new("bad");
    let files = texts(&d);
    for v in [0, 256, 70_000] {
        let opts = BpeTrainOptions {
            vocab_size: v,
            min_frequency: 2,
        };
        let e = Tokenizer::train_bpe(&files, &opts).unwrap_err();
        assert!(e.to_string().contains("257..=65536"), "{e}");
    }
    let t = train(&files, 300);
    let bad = d.0.join("latin1.txt");
    std::fs::write(&bad, b"caf\xe9\n").unwrap();
    let empty = d.0.join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    for (f, needle) in [
        (bad, "not valid UTF-8 at byte 3"),
        (empty, "empty file"),
        (d.0.join("missing.txt"), "missing.txt"),
    ] {
        let out = d.0.join("out");
        let e = tokenize_files(&[files[0].clone(), f], &t, &out, 1000, &|_| {}).unwrap_err();
        assert!(e.to_string().contains(needle), "{needle}: {e}");
        assert!(!out.exists());
    }
    let e = tokenize_files(&files, &t, &d.0.join("o2"), 0, &|_| {}).unwrap_err();
    assert!(e.to_string().contains("shards hold"), "{e}");
    // Tokenizer files that are not a byte-level BPE, or not JSON.
    let p = d.0.join("wordlevel.json");
    let mut v: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
    v["pre_tokenizer"] = serde_json::json!({"type": "Whitespace"});
    std::fs::write(&p, v.to_string()).unwrap();
    let e = Tokenizer::from_file(&p).unwrap_err();
    assert!(e.to_string().contains("byte-level BPE is needed"), "{e}");
    std::fs::write(&p, "{not json").unwrap();
    assert!(Tokenizer::from_file(&p).is_err());
    // No leftovers of the failed runs.
    let names: Vec<String> = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

/// `trainer tokenize` refuses an output it could not write, and a bad shard size, before it
/// spends time training a tokenizer.
#[test]
fn the_command_checks_its_output_before_training() {
    let d = TempDir::new("early");
    let files = texts(&d);
    let taken = d.0.join("taken");
    std::fs::create_dir_all(&taken).unwrap();
    std::fs::write(taken.join("keep.txt"), "mine").unwrap();
    let file = files[0].to_str().unwrap();
    for (out, extra, needle) in [
        (d.path("taken"), None, "the output exists and is not empty"),
        (d.path("fresh"), Some("0"), "shards hold"),
    ] {
        let mut args = vec!["tokenize", "--quiet", "--vocab", "300", "--out", &out];
        if let Some(n) = extra {
            args.extend(["--shard-tokens", n]);
        }
        args.push(file);
        let o = trainer(&args);
        assert!(!o.status.success());
        assert!(stderr(&o).contains(needle), "{}", stderr(&o));
        // refused before the BPE was trained
        assert!(
            !stdout(&o).contains("trained a byte-level BPE"),
            "{}",
            stdout(&o)
        );
    }
    assert_eq!(
        std::fs::read_to_string(taken.join("keep.txt")).unwrap(),
        "mine"
    );
    assert!(!d.0.join("fresh").exists());
}

fn ok(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}\n{}", stdout(o), stderr(o));
    stdout(o)
}

#[test]
fn tokenize_train_sample_export_on_bpe_data() {
    let d = TempDir::new("cli");
    let files = texts(&d);
    let tok = d.path("tok");
    let out = ok(&trainer(&[
        "tokenize",
        files[0].to_str().unwrap(),
        files[1].to_str().unwrap(),
        "--out",
        &tok,
        "--vocab",
        "320",
        "--quiet",
    ]));
    assert!(
        out.contains("trained a byte-level BPE of 320 tokens"),
        "{out}"
    );
    assert!(Path::new(&tok).join("tokenizer.json").is_file());
    assert!(Path::new(&tok).join("shard_000000.bin").is_file());

    let run = d.path("run");
    let out = ok(&trainer(&[
        "train", "--preset", "tiny", "--steps", "2", "--recipe", "bf16", "--data", &tok, "--quiet",
        "--out", &run,
    ]));
    assert!(out.contains("model vocabulary 256 -> 320"), "{out}");
    // The run keeps the tokenizer.
    let kept = std::fs::read_to_string(Path::new(&run).join("tokenizer.json")).unwrap();
    let orig = std::fs::read_to_string(Path::new(&tok).join("tokenizer.json")).unwrap();
    assert_eq!(kept, orig);
    let ck = trainer::checkpoint::load(Path::new(&run)).unwrap();
    assert_eq!(ck.state.model.vocab, 320);

    // Sampling encodes the prompt and decodes with the BPE: the text starts with the prompt.
    let sample = |src: &str, ids: bool| {
        let mut a = vec![
            "sample", src, "--recipe", "fp32", "--tokens", "12", "--prompt", "The fox",
        ];
        if ids {
            a.push("--ids");
        }
        ok(&trainer(&a))
    };
    let text = sample(&run, false);
    assert!(text.starts_with("The fox"), "{text}");
    let ids: Vec<u32> = sample(&run, true)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    let t = Tokenizer::from_file(&Path::new(&tok).join("tokenizer.json")).unwrap();
    assert_eq!(
        ids[..t.encode("The fox").unwrap().len()],
        t.encode("The fox").unwrap()[..]
    );
    assert_eq!(format!("{}\n", t.decode(&ids).unwrap()), text);

    // The export ships the same tokenizer, and samples from it are the checkpoint's.
    let hf = d.path("hf");
    let out = ok(&trainer(&["export", &run, "--out", &hf]));
    assert!(!out.contains("note:"), "{out}");
    let shipped = std::fs::read_to_string(Path::new(&hf).join("tokenizer.json")).unwrap();
    assert_eq!(shipped, orig);
    assert!(Path::new(&hf).join("tokenizer_config.json").is_file());
    assert_eq!(sample(&hf, false), text);

    // A tokenizer that is gone: the run still has its copy; without it, and with the
    // folder gone, the run's tokenizer is unknown.
    std::fs::remove_dir_all(&tok).unwrap();
    assert_eq!(sample(&run, false), text);
    std::fs::remove_file(Path::new(&run).join("tokenizer.json")).unwrap();
    let o = trainer(&["sample", &run, "--tokens", "2"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("tokenizer.json"), "{}", stderr(&o));
}
