//! How the JSON logs keep a span's fields: as one JSON object that a field recorded later is
//! appended to, instead of `tracing-subscriber`'s `JsonFields`, which parses the object and
//! writes it anew each time a field is recorded on the span.
//!
//! Every request makes four spans (`request`, `call`, `tool`, `store.write`) and records nine
//! fields on them after they are made (the status, the session, the outcome…); with the JSON
//! log format, `JsonFields` cost ~26 µs of CPU per recorded read over the text format (issue 28,
//! docs/benchmarks.md). The object written here is the one `JsonFields` writes but for the
//! order of its keys (the order they were recorded in) and a key recorded twice, which appears
//! twice (the later one is what the log line shows: the event formatter parses the object
//! before it writes the line).
use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// The JSON log format's span fields, appended to rather than rewritten.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct JsonSpanFields;

impl<'writer> FormatFields<'writer> for JsonSpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut object = String::from("{");
        fields.record(&mut Members::new(&mut object, true));
        object.push('}');
        writer.write_str(&object)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let object = &mut current.fields;
        // What `format_fields` wrote is an object; anything else (nothing yet) starts one.
        let first = if object.starts_with('{') && object.ends_with('}') {
            object.pop();
            object.len() == 1
        } else {
            object.clear();
            object.push('{');
            true
        };
        fields.record(&mut Members::new(object, first));
        object.push('}');
        Ok(())
    }
}

/// Writes `"name":value` members, comma-separated, at the end of an object being written.
struct Members<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Members<'a> {
    fn new(out: &'a mut String, first: bool) -> Self {
        Self { out, first }
    }

    /// Starts a member: the comma before it and its name. `false` for a field that is the
    /// `log` crate's metadata (`log.target`, …), which the event line already carries.
    fn key(&mut self, field: &Field) -> bool {
        let name = field.name();
        if name.starts_with("log.") {
            return false;
        }
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        string(self.out, name.strip_prefix("r#").unwrap_or(name));
        self.out.push(':');
        true
    }
}

/// A JSON string, escaped as `serde_json` escapes it.
fn string(out: &mut String, value: &str) {
    match serde_json::to_string(value) {
        Ok(quoted) => out.push_str(&quoted),
        // Serializing a `str` cannot fail; should it, the member still has a value.
        Err(_) => out.push_str("null"),
    }
}

impl Visit for Members<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.key(field) {
            // As `serde_json::Value::from(f64)`: a number, or null when it is not finite.
            match serde_json::Number::from_f64(value) {
                Some(n) => {
                    let _ = write!(self.out, "{n}");
                }
                None => self.out.push_str("null"),
            }
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.key(field) {
            let _ = write!(self.out, "{value}");
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.key(field) {
            let _ = write!(self.out, "{value}");
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.key(field) {
            self.out.push_str(if value { "true" } else { "false" });
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if self.key(field) {
            string(self.out, value);
        }
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        if self.key(field) {
            // As `serde_json::Value::from(&[u8])`: an array of numbers.
            self.out.push('[');
            for (i, byte) in value.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{byte}");
            }
            self.out.push(']');
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.key(field) {
            string(self.out, &format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};
    use tracing::field::Empty;
    use tracing_subscriber::fmt::format::JsonFields;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Spans with fields of every kind, some recorded after the span was made (one of them
    /// twice), and an event inside them; the log lines written, parsed.
    fn lines_with<N>(fields: N) -> Vec<Value>
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let sink = Sink::default();
        let out = sink.clone();
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .without_time()
            .fmt_fields(fields)
            .with_writer(move || out.clone());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!(
                "request",
                method = %"POST",
                path = "/v1/sessions/\"x\"\n\u{1}",
                count = 3_u64,
                delta = -4_i64,
                ratio = 0.5_f64,
                nan = f64::NAN,
                ok = true,
                r#type = "raw",
                session.id = Empty,
                status = Empty,
            );
            outer.record("session.id", tracing::field::display("0196-…"));
            outer.record("status", 200_u64);
            outer.record("status", 201_u64);
            let _outer = outer.enter();
            let inner = tracing::info_span!("call", tool = "read_file", outcome = Empty);
            inner.record("outcome", tracing::field::debug(Some("committed")));
            let _inner = inner.enter();
            tracing::info!(answer = 42, "inside");
            let bare = tracing::info_span!("bare", late = Empty);
            bare.record("late", "set after");
            let _bare = bare.enter();
            tracing::warn!("deepest");
        });
        let bytes = sink.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn log_lines_carry_the_span_fields_json_fields_would() {
        let ours = lines_with(JsonSpanFields);
        let stock = lines_with(JsonFields::default());
        assert_eq!(ours, stock);
        assert_eq!(ours.len(), 2);
        assert_eq!(
            ours[0]["span"],
            json!({
                "name": "call",
                "tool": "read_file",
                "outcome": "Some(\"committed\")",
            })
        );
        let request = &ours[0]["spans"][0];
        assert_eq!(request["path"], "/v1/sessions/\"x\"\n\u{1}");
        assert_eq!(request["status"], 201);
        assert_eq!(request["delta"], -4);
        assert_eq!(request["ratio"], 0.5);
        assert_eq!(request["nan"], Value::Null);
        assert_eq!(request["type"], "raw");
        assert_eq!(request["session.id"], "0196-…");
        assert_eq!(ours[1]["span"]["late"], "set after");
    }
}
