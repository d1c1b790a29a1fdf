//! Tasks with verifiable rewards, generated deterministically from a seed (no download).
//!
//! Every example is a line: a prompt that starts with `\n` (the separator the pretraining mix
//! puts before every example, so it acts as a start token) and ends with `=`, and an answer
//! that the model must write followed by `\n` (the stop token).
//!
//! * `add`: `\n47+8=` → `55`. Operands have 1 or 2 digits (each length equally likely, then
//!   uniform), answer in decimal without leading zeros.
//! * `reverse`: `\nrev tqbxa=` → `axbqt`: 3 to 8 lowercase letters written backwards (the
//!   answer's first letter is the prompt's last: long-range copying in reverse order).
//!
//! Reward: 1 when the completion is exactly the answer followed by the stop token, else 0 (no
//! partial or format reward). The held-out set is a fixed subset of the example space (an
//! example belongs to it when a hash of its prompt is 0 mod 8), never drawn for training or
//! for the pretraining mix; examples of either split come from a seeded xoshiro256** stream
//! that skips the other split's examples.

use serde::{Deserialize, Serialize};

use crate::rng::{SplitMix64, Xoshiro256StarStar};

/// The stop token ends every answer.
pub const STOP: u8 = b'\n';

/// Task names.
pub const TASK_NAMES: [&str; 2] = ["add", "reverse"];

/// A built-in task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// Addition of operands of up to 2 digits.
    Add,
    /// Reversing a string of 3 to 8 letters.
    Reverse,
}

/// Which part of the example space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Training prompts and the pretraining mix.
    Train,
    /// The held-out evaluation set.
    HeldOut,
}

/// One example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// Prompt text (`\n...=`).
    pub prompt: String,
    /// The answer (without the stop token).
    pub answer: String,
}

/// Why a task name was not accepted.
#[derive(Debug, thiserror::Error)]
#[error("unknown task '{0}'; valid: add, reverse")]
pub struct UnknownTask(pub String);

fn held_out(prompt: &str) -> bool {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    for b in prompt.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    SplitMix64::new(h).next_u64().is_multiple_of(8)
}

impl Task {
    /// A task by name.
    pub fn from_name(name: &str) -> Result<Task, UnknownTask> {
        match name {
            "add" => Ok(Task::Add),
            "reverse" => Ok(Task::Reverse),
            _ => Err(UnknownTask(name.into())),
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Task::Add => "add",
            Task::Reverse => "reverse",
        }
    }

    /// New tokens a correct answer needs at most, stop token included.
    pub fn max_answer_tokens(self) -> usize {
        match self {
            Task::Add => 4,
            Task::Reverse => 9,
        }
    }

    fn draw(self, rng: &mut Xoshiro256StarStar) -> Example {
        match self {
            Task::Add => {
                let mut operand = || {
                    let digits = 1 + rng.below(2) as u32;
                    let lo = if digits == 1 {
                        0
                    } else {
                        10u64.pow(digits - 1)
                    };
                    lo + rng.below(10u64.pow(digits) - lo)
                };
                let (a, b) = (operand(), operand());
                Example {
                    prompt: format!("\n{a}+{b}="),
                    answer: (a + b).to_string(),
                }
            }
            Task::Reverse => {
                let n = 3 + rng.below(6) as usize;
                let s: String = (0..n)
                    .map(|_| (b'a' + rng.below(26) as u8) as char)
                    .collect();
                Example {
                    prompt: format!("\nrev {s}="),
                    answer: s.chars().rev().collect(),
                }
            }
        }
    }

    /// `n` examples of `split` from the stream seeded with `seed` (the same seed and split
    /// always give the same sequence; `examples(s, split, n)` is a prefix of
    /// `examples(s, split, m)` for `n <= m`).
    ///
    /// ```
    /// use trainer::rl::tasks::{Split, Task};
    /// let ex = Task::Add.examples(0, Split::Train, 3);
    /// assert_eq!(ex, Task::Add.examples(0, Split::Train, 5)[..3]);
    /// assert!(ex.iter().all(|e| e.prompt.starts_with('\n') && e.prompt.ends_with('=')));
    /// ```
    pub fn examples(self, seed: u64, split: Split, n: usize) -> Vec<Example> {
        let mut rng = Xoshiro256StarStar::seed_from_u64(seed ^ self as u64);
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let e = self.draw(&mut rng);
            if held_out(&e.prompt) == (split == Split::HeldOut) {
                out.push(e);
            }
        }
        out
    }

    /// The reward of `completion` (the generated tokens) for `example`: 1 for exactly the
    /// answer followed by the stop token, else 0.
    ///
    /// ```
    /// use trainer::rl::tasks::{Example, Task};
    /// let e = Example { prompt: "\n417+86=".into(), answer: "503".into() };
    /// assert_eq!(Task::Add.reward(&e, b"503\n"), 1.0);
    /// assert_eq!(Task::Add.reward(&e, b"503"), 0.0);   // never stopped
    /// assert_eq!(Task::Add.reward(&e, b"5030\n"), 0.0);
    /// ```
    pub fn reward(self, example: &Example, completion: &[u8]) -> f32 {
        match completion.split_last() {
            Some((&STOP, body)) if body == example.answer.as_bytes() => 1.0,
            _ => 0.0,
        }
    }

    /// Pretraining text: `examples` training examples (each on its own line) in groups of 8
    /// between paragraphs of the default corpus (seed `seed`), until `corpus_bytes` of corpus
    /// are used.
    pub fn mix(self, seed: u64, examples: usize, corpus_bytes: usize) -> String {
        let corpus = crate::data::generate(seed, corpus_bytes);
        let paragraphs: Vec<&str> = corpus.split("\n\n").collect();
        let ex = self.examples(seed.wrapping_add(1), Split::Train, examples);
        let groups = ex.chunks(8).count().max(1);
        let per = paragraphs.len().div_ceil(groups).max(1);
        let mut out = String::new();
        let mut paras = paragraphs.chunks(per);
        for chunk in ex.chunks(8) {
            for e in chunk {
                out.push_str(&e.prompt);
                out.push_str(&e.answer);
            }
            out.push_str("\n\n");
            if let Some(p) = paras.next() {
                out.push_str(&p.join("\n\n"));
                out.push_str("\n\n");
            }
        }
        for p in paras {
            out.push_str(&p.join("\n\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewards_of_hand_written_completions() {
        let add = Example {
            prompt: "\n99+1=".into(),
            answer: "100".into(),
        };
        for (c, r) in [
            (&b"100\n"[..], 1.0),
            (b"10\n", 0.0),
            (b"100", 0.0),
            (b"0100\n", 0.0),
            (b"\n", 0.0),
            (b"", 0.0),
            (b"100\n\n", 0.0),
        ] {
            assert_eq!(Task::Add.reward(&add, c), r, "{c:?}");
        }
        let rev = Example {
            prompt: "\nrev abc=".into(),
            answer: "cba".into(),
        };
        assert_eq!(Task::Reverse.reward(&rev, b"cba\n"), 1.0);
        assert_eq!(Task::Reverse.reward(&rev, b"abc\n"), 0.0);
        assert_eq!(Task::Reverse.reward(&rev, b"cb\n"), 0.0);
    }

    #[test]
    fn examples_are_correct_and_splits_disjoint() {
        for task in [Task::Add, Task::Reverse] {
            let train = task.examples(3, Split::Train, 400);
            let held = task.examples(3, Split::HeldOut, 100);
            let ht: std::collections::HashSet<_> = held.iter().map(|e| e.prompt.clone()).collect();
            assert!(train.iter().all(|e| !ht.contains(&e.prompt)));
            for e in train.iter().chain(&held) {
                let body = e.prompt.trim_start_matches('\n').trim_end_matches('=');
                match task {
                    Task::Add => {
                        let (a, b) = body.split_once('+').unwrap();
                        let s: u64 = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
                        assert_eq!(s.to_string(), e.answer);
                    }
                    Task::Reverse => {
                        let s = body.strip_prefix("rev ").unwrap();
                        assert_eq!(s.chars().rev().collect::<String>(), e.answer);
                    }
                }
                assert!(e.answer.len() < task.max_answer_tokens());
            }
        }
        assert_eq!(
            Task::from_name("sort").unwrap_err().to_string(),
            "unknown task 'sort'; valid: add, reverse"
        );
    }
}
