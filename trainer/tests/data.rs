//! Tests of `trainer::data`: token streams, text files, shards (including corrupt ones),
//! splits, batching and resumption, statistics.

use std::path::{Path, PathBuf};

use trainer::data::{
    self, conditional_entropy_bits, load_text_file, open_shard, split, unigram_entropy_bits,
    unigram_entropy_nats, write_llmc_shard, write_raw_shard, Batcher, BatcherConfig, BatcherState,
    DataError, DataSource, Sampling, ShardFormat, ShardLayout, TokenStats, Tokens, GPT2_VOCAB,
    LLMC_MAGIC,
};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn header(magic: i32, version: i32, count: i32) -> Vec<u8> {
    let mut h = [0i32; 256];
    h[0] = magic;
    h[1] = version;
    h[2] = count;
    h.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn le(tokens: &[u16]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

// --- token streams ----------------------------------------------------------------------

#[test]
fn tokens_views_share_and_index() {
    let t = Tokens::from_text("hello world");
    assert_eq!(t.len(), 11);
    assert_eq!(t.vocab_size(), 256);
    assert_eq!(t.get(4), b'o' as u32);
    let s = t.slice(6..11);
    assert_eq!(
        s.to_vec(0..5),
        b"world".iter().map(|&b| b as u32).collect::<Vec<_>>()
    );
    assert_eq!(s.slice(1..3).to_vec(0..2), vec![b'o' as u32, b'r' as u32]);
    assert_eq!(t.iter().count(), 11);
    let mut out = [0u32; 3];
    t.copy_to(2, &mut out);
    assert_eq!(out, [b'l' as u32, b'l' as u32, b'o' as u32]);
    assert!(!t.is_mapped());
    assert!(Tokens::from_bytes(vec![]).is_empty());
}

#[test]
fn u16_tokens_are_checked_against_the_vocabulary() {
    let t = Tokens::from_u16(vec![1, 2, 300], 301).unwrap();
    assert_eq!(t.get(2), 300);
    let e = Tokens::from_u16(vec![1, 2, 300, 5], 300).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TokenOutOfRange {
                index: 2,
                token: 300,
                vocab_size: 300,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn split_takes_the_tail_deterministically() {
    let t = Tokens::from_text(&"x".repeat(1000));
    let (train, val) = split(&t, 0.1).unwrap();
    assert_eq!((train.len(), val.len()), (900, 100));
    let (train, val) = split(&t, 0.0).unwrap();
    assert_eq!((train.len(), val.len()), (1000, 0));
    let (train, val) = split(&t, 0.0001).unwrap();
    assert_eq!(
        (train.len(), val.len()),
        (999, 1),
        "rounded up to a whole token"
    );
    let text: String = (0..100u8).map(|i| (b'a' + i % 26) as char).collect();
    let t = Tokens::from_text(&text);
    let (train, val) = split(&t, 0.25).unwrap();
    assert_eq!(val.get(0), t.get(75));
    assert_eq!(train.get(74), t.get(74));
    assert!(matches!(split(&t, 1.0), Err(DataError::InvalidConfig(_))));
    assert!(matches!(split(&t, -0.1), Err(DataError::InvalidConfig(_))));
    assert!(matches!(
        split(&t, f64::NAN),
        Err(DataError::InvalidConfig(_))
    ));
    assert!(matches!(
        split(&Tokens::from_text("a"), 0.5),
        Err(DataError::TooShort { .. })
    ));
}

// --- text files -------------------------------------------------------------------------

#[test]
fn text_files_load_as_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "ok.txt", "héllo\nwörld\n".as_bytes());
    let t = load_text_file(&p).unwrap();
    assert_eq!(t.len(), 14); // é and ö are two bytes each
    assert_eq!(t.vocab_size(), 256);
    assert_eq!(t.get(1), 0xC3);
    assert!(t.origin().ends_with("ok.txt"));
}

#[test]
fn invalid_utf8_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "bad.txt", b"line one\nline \xFFtwo\n");
    let e = load_text_file(&p).unwrap_err();
    match &e {
        DataError::InvalidUtf8 {
            offset,
            line,
            column,
            ..
        } => {
            assert_eq!((*offset, *line, *column), (14, 2, 6));
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("bad.txt") && msg.contains("not valid UTF-8") && msg.contains("line 2"),
        "{msg}"
    );
    // A truncated multi-byte sequence at the end.
    let p = write(dir.path(), "cut.txt", &"abé".as_bytes()[..3]);
    assert!(matches!(
        load_text_file(&p),
        Err(DataError::InvalidUtf8 { offset: 2, .. })
    ));
}

#[test]
fn missing_and_empty_text_files() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_text_file(&dir.path().join("nope.txt")).unwrap_err();
    assert!(matches!(e, DataError::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("nope.txt"));
    let p = write(dir.path(), "empty.txt", b"");
    assert!(matches!(load_text_file(&p), Err(DataError::Empty { .. })));
}

// --- shards -----------------------------------------------------------------------------

#[test]
fn llmc_shards_round_trip_memory_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let toks: Vec<u16> = (0..5000u32).map(|i| (i * 7919 % 50257) as u16).collect();
    let p = dir.path().join("train_000001.bin");
    write_llmc_shard(&p, &toks).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 1024 + 2 * 5000);
    for format in [ShardFormat::Auto, ShardFormat::LlmC] {
        let s = open_shard(&p, format, GPT2_VOCAB).unwrap();
        assert_eq!(s.layout, ShardLayout::LlmC { version: 1 });
        assert!(s.tokens.is_mapped());
        assert_eq!(s.tokens.len(), 5000);
        assert_eq!(s.tokens.vocab_size(), GPT2_VOCAB);
        let got: Vec<u16> = s.tokens.iter().map(|t| t as u16).collect();
        assert_eq!(got, toks);
        assert_eq!(
            s.tokens.slice(10..20).to_vec(0..10),
            s.tokens.to_vec(10..20)
        );
    }
    // The header read as raw tokens starts with the magic's low half, 55432 >= 50257.
    let e = open_shard(&p, ShardFormat::Raw, GPT2_VOCAB).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TokenOutOfRange {
                index: 0,
                token: 55432,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(LLMC_MAGIC as u32 & 0xFFFF, 55432);
}

#[test]
fn raw_nanogpt_shards_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let toks: Vec<u16> = (0..3001u32).map(|i| (i % 50000) as u16).collect();
    let p = dir.path().join("val.bin");
    write_raw_shard(&p, &toks).unwrap();
    for format in [ShardFormat::Auto, ShardFormat::Raw] {
        let s = open_shard(&p, format, GPT2_VOCAB).unwrap();
        assert_eq!(s.layout, ShardLayout::Raw);
        assert_eq!(s.tokens.len(), 3001);
        assert_eq!(s.tokens.get(3000), 3000);
    }
    // Forced llm.c on a headerless file.
    let e = open_shard(&p, ShardFormat::LlmC, GPT2_VOCAB).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::BadMagic {
                found: 0x0001_0000,
                expected: LLMC_MAGIC,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("bad magic"));
}

#[test]
fn corrupt_shards_give_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let open = |p: &Path| open_shard(p, ShardFormat::Auto, GPT2_VOCAB).unwrap_err();

    // Version 2 (uint32 tokens) is not supported.
    let mut b = header(LLMC_MAGIC, 2, 4);
    b.extend(le(&[1, 2, 3, 4]));
    let e = open(&write(d, "v2.bin", &b));
    assert!(
        matches!(e, DataError::UnsupportedVersion { version: 2, .. }),
        "{e:?}"
    );

    // Fewer tokens than the header says.
    let mut b = header(LLMC_MAGIC, 1, 10);
    b.extend(le(&[1, 2, 3]));
    let e = open(&write(d, "short.bin", &b));
    assert!(
        matches!(
            e,
            DataError::Truncated {
                expected: 1044,
                actual: 1030,
                ..
            }
        ),
        "{e:?}"
    );

    // More bytes than the header says.
    let mut b = header(LLMC_MAGIC, 1, 2);
    b.extend(le(&[1, 2, 3]));
    let e = open(&write(d, "long.bin", &b));
    assert!(
        matches!(
            e,
            DataError::TrailingBytes {
                expected: 1028,
                actual: 1030,
                ..
            }
        ),
        "{e:?}"
    );

    // A header cut short.
    let b = header(LLMC_MAGIC, 1, 2)[..100].to_vec();
    let e = open(&write(d, "cut-header.bin", &b));
    assert!(
        matches!(
            e,
            DataError::Truncated {
                expected: 1024,
                actual: 100,
                ..
            }
        ),
        "{e:?}"
    );

    // A negative count.
    let e = open(&write(d, "neg.bin", &header(LLMC_MAGIC, 1, -5)));
    assert!(
        matches!(e, DataError::BadTokenCount { count: -5, .. }),
        "{e:?}"
    );

    // No tokens.
    let e = open(&write(d, "zero.bin", &header(LLMC_MAGIC, 1, 0)));
    assert!(matches!(e, DataError::Empty { .. }), "{e:?}");
    let e = open(&write(d, "empty.bin", b""));
    assert!(matches!(e, DataError::Empty { .. }), "{e:?}");

    // A token outside the vocabulary, in llm.c and raw files.
    let mut b = header(LLMC_MAGIC, 1, 4);
    b.extend(le(&[1, 2, 50257, 4]));
    let e = open(&write(d, "oov.bin", &b));
    assert!(
        matches!(
            e,
            DataError::TokenOutOfRange {
                index: 2,
                token: 50257,
                vocab_size: 50257,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("oov.bin"));
    let e = open_shard(
        &write(d, "oov-raw.bin", &le(&[9, 300])),
        ShardFormat::Raw,
        256,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TokenOutOfRange {
                index: 1,
                token: 300,
                vocab_size: 256,
                ..
            }
        ),
        "{e:?}"
    );

    // An odd number of bytes in a raw file.
    let e = open(&write(d, "odd.bin", &[1, 0, 2]));
    assert!(matches!(e, DataError::OddLength { len: 3, .. }), "{e:?}");

    // A missing file.
    let e = open(&d.join("missing.bin"));
    assert!(matches!(e, DataError::Io { .. }), "{e:?}");
}

#[test]
fn large_vocab_shards_skip_nothing() {
    // Vocabulary 65536: every uint16 is valid.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("all.bin");
    write_raw_shard(&p, &[0, 65535, 1]).unwrap();
    let s = open_shard(&p, ShardFormat::Raw, 65536).unwrap();
    assert_eq!(s.tokens.get(1), 65535);
}

// --- data sources -----------------------------------------------------------------------

#[test]
fn data_sources_load_and_serialize() {
    let dir = tempfile::tempdir().unwrap();
    let text = write(dir.path(), "t.txt", b"some text");
    let shard = dir.path().join("s.bin");
    write_llmc_shard(&shard, &[5, 6, 7]).unwrap();
    let sources = [
        DataSource::Corpus {
            seed: 3,
            bytes: 1000,
        },
        DataSource::Text { path: text },
        DataSource::Shard {
            path: shard,
            format: ShardFormat::Auto,
            vocab_size: 8,
        },
    ];
    let lens = [1000, 9, 3];
    for (s, len) in sources.iter().zip(lens) {
        let t = s.load().unwrap();
        assert_eq!(t.len(), len);
        assert_eq!(t.vocab_size(), s.vocab_size());
        let toml_text = toml::to_string(s).unwrap();
        assert_eq!(&toml::from_str::<DataSource>(&toml_text).unwrap(), s);
        let json = serde_json::to_string(s).unwrap();
        assert_eq!(&serde_json::from_str::<DataSource>(&json).unwrap(), s);
    }
    let corpus = sources[0].load().unwrap();
    assert_eq!(
        corpus.to_vec(0..1000),
        data::generate(3, 1000)
            .bytes()
            .map(u32::from)
            .collect::<Vec<_>>()
    );
    let e = toml::from_str::<DataSource>("kind = \"corpus\"\nseed = 1\nbytes = 10\nsede = 2\n")
        .unwrap_err();
    assert!(e.to_string().contains("unknown field `sede`"), "{e}");
    let e = toml::from_str::<DataSource>("kind = \"web\"\n").unwrap_err();
    assert!(
        e.to_string().contains("corpus") && e.to_string().contains("shard"),
        "{e}"
    );
    assert!(matches!(
        DataSource::Corpus { seed: 0, bytes: 0 }.load(),
        Err(DataError::Empty { .. })
    ));
}

// --- batching ---------------------------------------------------------------------------

fn corpus_tokens(bytes: usize) -> Tokens {
    DataSource::Corpus { seed: 21, bytes }.load().unwrap()
}

fn cfg(batch: usize, seq: usize, sampling: Sampling, seed: u64) -> BatcherConfig {
    BatcherConfig {
        batch,
        seq,
        sampling,
        seed,
    }
}

/// Start of the window whose inputs are `row` (windows are substrings of the stream).
fn window_start(t: &Tokens, row: &[u32]) -> usize {
    let all = t.to_vec(0..t.len());
    (0..=all.len() - row.len())
        .find(|&s| all[s..s + row.len()] == *row)
        .expect("window not in stream")
}

#[test]
fn batches_are_shifted_windows_of_the_stream() {
    let t = corpus_tokens(20_000);
    let mut b = Batcher::new(t.clone(), cfg(8, 128, Sampling::Random, 1)).unwrap();
    for _ in 0..5 {
        let batch = b.next_batch();
        assert_eq!((batch.batch, batch.seq), (8, 128));
        assert_eq!(batch.inputs.len(), 8 * 128);
        assert_eq!(batch.targets.len(), 8 * 128);
        for r in 0..8 {
            let (x, y) = (batch.input_row(r), batch.target_row(r));
            assert_eq!(x[1..], y[..127]);
            let s = window_start(&t, x);
            assert_eq!(y[127], t.get(s + 128));
        }
    }
    assert_eq!(b.batches_drawn(), 5);
}

#[test]
fn batches_are_deterministic_from_the_seed() {
    let t = corpus_tokens(50_000);
    let run = |seed| {
        Batcher::new(t.clone(), cfg(4, 32, Sampling::Random, seed))
            .unwrap()
            .take(10)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn random_sampling_covers_every_start() {
    // 40 tokens, seq 8: starts 0..=31, including the last whole window.
    let text: String = (0..40u8).map(|i| (b'0' + i) as char).collect();
    let t = Tokens::from_text(&text);
    let mut b = Batcher::new(t, cfg(16, 8, Sampling::Random, 0)).unwrap();
    let mut seen = [false; 32];
    for _ in 0..100 {
        let batch = b.next_batch();
        for r in 0..16 {
            let s = (batch.input_row(r)[0] - b'0' as u32) as usize;
            seen[s] = true;
        }
    }
    assert!(seen.iter().all(|&x| x), "{seen:?}");
}

#[test]
fn sequential_sampling_reads_in_order_and_wraps() {
    let text: String = (0..50u8).map(|i| (b'0' + i) as char).collect();
    let t = Tokens::from_text(&text);
    let mut b = Batcher::new(t, cfg(2, 10, Sampling::Sequential, 99)).unwrap();
    assert_eq!(b.windows_per_pass(), 4);
    let starts = |b: &mut Batcher| {
        let batch = b.next_batch();
        (0..2)
            .map(|r| batch.input_row(r)[0] - b'0' as u32)
            .collect::<Vec<_>>()
    };
    assert_eq!(starts(&mut b), [0, 10]);
    assert_eq!(starts(&mut b), [20, 30]);
    assert_eq!(
        starts(&mut b),
        [0, 10],
        "wraps: 40..51 is not a whole window"
    );
    b.reset();
    assert_eq!(starts(&mut b), [0, 10]);
    // The last target of a window is the token after it.
    let batch = Batcher::new(
        Tokens::from_text(&text),
        cfg(1, 49, Sampling::Sequential, 0),
    )
    .unwrap()
    .next_batch();
    assert_eq!(*batch.targets.last().unwrap(), b'0' as u32 + 49);
}

#[test]
fn resumed_batcher_continues_exactly() {
    let t = corpus_tokens(100_000);
    for sampling in [Sampling::Random, Sampling::Sequential] {
        let c = cfg(4, 64, sampling, 42);
        let mut straight = Batcher::new(t.clone(), c).unwrap();
        let expected: Vec<_> = (&mut straight).take(30).collect();

        let mut first = Batcher::new(t.clone(), c).unwrap();
        let head: Vec<_> = (&mut first).take(13).collect();
        // Save through JSON and TOML, as a checkpoint would.
        let json = serde_json::to_string(&first.state()).unwrap();
        let toml_text = toml::to_string(&first.state()).unwrap();
        let from_toml: BatcherState = toml::from_str(&toml_text).unwrap();
        assert_eq!(from_toml, first.state());
        let state: BatcherState = serde_json::from_str(&json).unwrap();
        drop(first);
        let mut resumed = Batcher::from_state(t.clone(), &state).unwrap();
        assert_eq!(resumed.batches_drawn(), 13);
        let tail: Vec<_> = resumed.by_ref().take(17).collect();
        let joined: Vec<_> = head.into_iter().chain(tail).collect();
        assert_eq!(joined, expected, "{sampling:?}");
        assert_eq!(resumed.state(), straight.state());
    }
}

#[test]
fn resuming_on_other_data_is_refused() {
    let t = corpus_tokens(10_000);
    let b = Batcher::new(t.clone(), cfg(2, 16, Sampling::Random, 0)).unwrap();
    let state = b.state();
    let e = Batcher::from_state(t.slice(0..9_000), &state).unwrap_err();
    assert!(matches!(e, DataError::StateMismatch(_)), "{e:?}");
    let mut bad = state.clone();
    bad.cursor = 9_990;
    assert!(matches!(
        Batcher::from_state(t.clone(), &bad),
        Err(DataError::StateMismatch(_))
    ));
    let json = serde_json::to_string(&state)
        .unwrap()
        .replace("\"seed\"", "\"sed\"");
    assert!(serde_json::from_str::<BatcherState>(&json).is_err());
}

#[test]
fn batcher_rejects_bad_shapes() {
    let t = Tokens::from_text("0123456789");
    assert!(matches!(
        Batcher::new(t.clone(), cfg(0, 4, Sampling::Random, 0)),
        Err(DataError::InvalidConfig(_))
    ));
    assert!(matches!(
        Batcher::new(t.clone(), cfg(1, 0, Sampling::Random, 0)),
        Err(DataError::InvalidConfig(_))
    ));
    let e = Batcher::new(t.clone(), cfg(1, 10, Sampling::Random, 0)).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TooShort {
                needed: 11,
                available: 10,
                ..
            }
        ),
        "{e:?}"
    );
    // Exactly seq + 1 tokens: one window.
    let mut b = Batcher::new(t, cfg(2, 9, Sampling::Random, 0)).unwrap();
    let batch = b.next_batch();
    assert_eq!(batch.input_row(0), batch.input_row(1));
}

#[test]
fn batches_from_a_mapped_shard() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.bin");
    let toks: Vec<u16> = (0..1000).collect();
    write_llmc_shard(&p, &toks).unwrap();
    let t = open_shard(&p, ShardFormat::Auto, 1000).unwrap().tokens;
    let (train, _val) = split(&t, 0.1).unwrap();
    let mut b = Batcher::new(train, cfg(3, 20, Sampling::Random, 4)).unwrap();
    let batch = b.next_batch();
    for r in 0..3 {
        let x = batch.input_row(r);
        assert!(x.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(
            x[0] + 20 < 900,
            "the window stays inside the training split"
        );
        assert_eq!(batch.target_row(r)[19], x[19] + 1);
    }
}

// --- statistics -------------------------------------------------------------------------

#[test]
fn entropies_of_simple_streams() {
    let all: Vec<u8> = (0..=255).collect();
    let t = Tokens::from_bytes(all.repeat(4));
    assert!((unigram_entropy_bits(&t) - 8.0).abs() < 1e-12);
    assert!((unigram_entropy_nats(&t) - 8.0 * std::f64::consts::LN_2).abs() < 1e-12);
    assert_eq!(conditional_entropy_bits(&t, 1), 0.0);
    let t = Tokens::from_text("aabb");
    assert_eq!(unigram_entropy_bits(&t), 1.0);
    // Contexts a->a, a->b, b->b: H(next | a) = 1 bit on 2 of the 3 positions.
    assert!((conditional_entropy_bits(&t, 1) - 2.0 / 3.0).abs() < 1e-12);
    let s = TokenStats::of(&t);
    assert_eq!((s.n_tokens, s.vocab_size, s.distinct), (4, 256, 2));
    assert_eq!(s.unigram_nats(), std::f64::consts::LN_2);
    assert_eq!(unigram_entropy_bits(&Tokens::from_bytes(vec![])), 0.0);
}

#[test]
fn the_corpus_has_structure_beyond_unigrams() {
    let t = corpus_tokens(1 << 20);
    let h0 = unigram_entropy_bits(&t);
    let h1 = conditional_entropy_bits(&t, 1);
    let h3 = conditional_entropy_bits(&t, 3);
    assert!((4.0..4.8).contains(&h0), "{h0}");
    assert!(h1 < h0 - 0.8, "{h1} vs {h0}");
    assert!(h3 < 0.4 * h0, "{h3} vs {h0}");
}

#[test]
fn readme_sample_is_in_the_corpus() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let block = readme
        .split("<!-- corpus-sample:start -->")
        .nth(1)
        .and_then(|s| s.split("<!-- corpus-sample:end -->").next())
        .expect("README has the corpus sample markers");
    let sample = block
        .trim()
        .trim_start_matches("```text")
        .trim_end_matches("```")
        .trim();
    assert!(sample.len() > 200);
    assert!(
        data::generate(0, 8_000).contains(sample),
        "README sample is not in generate(0, 8000)"
    );
}
