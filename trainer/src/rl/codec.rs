//! Task text through the model's tokenizer: prompts are encoded with it, completions decoded
//! with it for the reward, and the stop `\n` is the token it encodes `\n` as.
//!
//! A tokenizer can express a task when (checked by [`TaskCodec::check`] on the examples a run
//! uses): it has no more tokens than the model; `\n` encodes as one token that decodes back
//! to `\n`; every prompt decodes back to its text; and the tokens of a prompt are a prefix of
//! the tokens of the whole example (`prompt + answer + \n`), the stop token last, so the model
//! sees at RL time the same tokens that it saw for the prompt in the pretraining mix. A
//! byte-level BPE with GPT-2's pre-tokenization satisfies all of these for the built-in tasks
//! (the regex splits at `\n`, `=`, between digits and `+` and before ` word`); a tokenizer
//! that does not is refused with the example that fails.
//!
//! ```
//! use trainer::rl::codec::TaskCodec;
//! use trainer::rl::tasks::{Example, Task};
//! let c = TaskCodec::bytes();
//! let e = Example { prompt: "\n7+5=".into(), answer: "12".into() };
//! assert_eq!(c.prompt(&e).unwrap(), b"\n7+5=".iter().map(|&b| b as u32).collect::<Vec<_>>());
//! assert_eq!(c.reward(Task::Add, &e, &[b'1' as u32, b'2' as u32, c.stop()]), 1.0);
//! assert_eq!(c.reward(Task::Add, &e, &[b'1' as u32, b'2' as u32]), 0.0); // never stopped
//! ```

use super::config::RlError;
use super::tasks::{Example, Task, STOP};
use crate::data::Tokenizer;

/// The tokenizer of an RL run and its stop token.
#[derive(Clone, Debug)]
pub struct TaskCodec {
    tokenizer: Tokenizer,
    stop: u32,
}

fn invalid(m: String) -> RlError {
    RlError::Invalid(m)
}

impl TaskCodec {
    /// Byte-level: one token per byte, the stop token is `b'\n'`.
    pub fn bytes() -> TaskCodec {
        TaskCodec {
            tokenizer: Tokenizer::Bytes,
            stop: STOP as u32,
        }
    }

    /// The codec of `tokenizer` for a model of `model_vocab` tokens. Errors: the tokenizer has
    /// more tokens than the model, or `\n` is not one token of it.
    pub fn new(tokenizer: Tokenizer, model_vocab: usize) -> Result<TaskCodec, RlError> {
        if tokenizer.vocab_size() as usize > model_vocab {
            return Err(invalid(format!(
                "the tokenizer ({}) has more tokens than the model's vocabulary ({model_vocab}): \
                 the task's prompts could encode to ids the model does not have",
                tokenizer.describe()
            )));
        }
        let nl = (STOP as char).to_string();
        let ids = tokenizer.encode(&nl).map_err(|e| e.to_string());
        let stop = match ids.as_deref() {
            Ok(&[s]) if tokenizer.decode(&[s]).ok().as_deref() == Some(nl.as_str()) => s,
            _ => {
                return Err(invalid(format!(
                    "the tokenizer ({}) has no single token for the stop `\\n` (it encodes as \
                     {ids:?}); the task's answers end with it",
                    tokenizer.describe()
                )))
            }
        };
        Ok(TaskCodec { tokenizer, stop })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The stop token's id.
    pub fn stop(&self) -> u32 {
        self.stop
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, RlError> {
        self.tokenizer
            .encode(text)
            .map_err(|e| invalid(format!("encoding {text:?}: {e}")))
    }

    /// The tokens of `example`'s prompt.
    pub fn prompt(&self, example: &Example) -> Result<Vec<u32>, RlError> {
        self.encode(&example.prompt)
    }

    /// The tokens of the whole example: prompt, answer and stop token.
    pub fn sequence(&self, example: &Example) -> Result<Vec<u32>, RlError> {
        self.encode(&format!(
            "{}{}{}",
            example.prompt, example.answer, STOP as char
        ))
    }

    /// The text of generated tokens, or `None` when an id is outside the tokenizer (it has
    /// no text; a model may have more tokens than its tokenizer).
    pub fn completion(&self, tokens: &[u32]) -> Option<String> {
        self.tokenizer.decode(tokens).ok()
    }

    /// The task's reward of the generated `tokens`, decoded through the tokenizer (0 when
    /// they do not decode).
    pub fn reward(&self, task: Task, example: &Example, tokens: &[u32]) -> f32 {
        match self.completion(tokens) {
            Some(text) => task.reward(example, text.as_bytes()),
            None => 0.0,
        }
    }

    /// Checks that the tokenizer expresses `task` on `examples` (see the module docs); the
    /// error names the first example that fails and why.
    pub fn check(&self, task: Task, examples: &[Example]) -> Result<(), RlError> {
        let fail = |e: &Example, why: String| {
            invalid(format!(
                "the tokenizer ({}) cannot express the task {}: example {:?} -> {:?}: {why}",
                self.tokenizer.describe(),
                task.name(),
                e.prompt,
                e.answer
            ))
        };
        for e in examples {
            let p = self.prompt(e)?;
            let back = self.completion(&p);
            if back.as_deref() != Some(e.prompt.as_str()) {
                return Err(fail(e, format!("the prompt decodes back as {back:?}")));
            }
            let full = self.sequence(e)?;
            if !full.starts_with(&p) {
                return Err(fail(
                    e,
                    format!(
                        "the prompt's tokens {p:?} are not a prefix of the example's {full:?} (a \
                         token spans the prompt and the answer)"
                    ),
                ));
            }
            if full.last() != Some(&self.stop) || full.len() <= p.len() + 1 {
                return Err(fail(
                    e,
                    format!("the example's tokens {full:?} do not end with an answer and the stop token {}", self.stop),
                ));
            }
            if task.reward(
                e,
                self.completion(&full[p.len()..])
                    .unwrap_or_default()
                    .as_bytes(),
            ) != 1.0
            {
                return Err(fail(
                    e,
                    "the answer's tokens do not decode to the answer".into(),
                ));
            }
        }
        Ok(())
    }
}
