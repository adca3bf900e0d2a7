//! Asking before a destructive command.
//!
//! Force-unlocking lets a second holder in while the first may still be working, so it needs a
//! person's yes. A script has no person behind its stdin: without `--yes` it is refused rather
//! than reading whatever happens to be piped in as consent.

use std::io::{BufRead, Write};

/// Whether the user consented.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Go ahead.
    Yes,
    /// The user said no (or nothing).
    No,
    /// Nobody could be asked; the message says how to confirm instead.
    CannotAsk(String),
}

/// Asks `question` on `prompt` and reads one line from `input`, when `interactive` (stdin is a
/// terminal); only `y` or `yes` consent.
pub fn ask(
    question: &str,
    interactive: bool,
    input: &mut impl BufRead,
    prompt: &mut impl Write,
) -> Answer {
    if !interactive {
        return Answer::CannotAsk(
            "stdin is not a terminal, so nobody can confirm; pass --yes to force-unlock anyway"
                .to_owned(),
        );
    }
    // A prompt that cannot be shown is not a question the user saw.
    if write!(prompt, "{question} [y/N] ")
        .and_then(|()| prompt.flush())
        .is_err()
    {
        return Answer::CannotAsk("could not show the confirmation prompt".to_owned());
    }
    let mut line = String::new();
    if input.read_line(&mut line).is_err() {
        return Answer::No;
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Answer::Yes,
        _ => Answer::No,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(typed: &str, interactive: bool) -> (Answer, String) {
        let mut shown = Vec::new();
        let answer = ask("Unlock?", interactive, &mut typed.as_bytes(), &mut shown);
        (answer, String::from_utf8(shown).unwrap())
    }

    #[test]
    fn only_yes_consents() {
        assert_eq!(answer("y\n", true).0, Answer::Yes);
        assert_eq!(answer("YES\n", true).0, Answer::Yes);
        assert_eq!(answer("\n", true).0, Answer::No);
        assert_eq!(answer("yep\n", true).0, Answer::No);
        assert_eq!(answer("", true).0, Answer::No);
    }

    #[test]
    fn the_question_is_shown_with_the_default() {
        assert_eq!(answer("n\n", true).1, "Unlock? [y/N] ");
    }

    #[test]
    fn piped_input_is_never_taken_as_consent() {
        let (answer, shown) = answer("y\n", false);
        assert!(matches!(answer, Answer::CannotAsk(m) if m.contains("--yes")));
        assert_eq!(shown, "");
    }
}
