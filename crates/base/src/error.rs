//! Errors as operators read them: the message and every cause, on one line.

/// `error` and its causes, `outer: inner: ...`. HTTP clients' top-level messages hide the cause
/// ("error sending request"); the chain says what actually failed.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|cause| cause as &(dyn std::error::Error + 'static))
        }
    }

    #[test]
    fn the_chain_names_every_cause_in_order() {
        let error = Layer(
            "error sending request",
            Some(Box::new(Layer("connect", Some(Box::new(Layer("refused", None)))))),
        );
        assert_eq!(error_chain(&error), "error sending request: connect: refused");
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
    }
}
