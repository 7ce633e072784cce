//! The command's log output: `tracing` events (the store's above all: a rank
//! vanished, a connection refused, the store thread panicked) printed on
//! stderr, one line each, `[ringleader store] warning: rank vanished without
//! leaving rank=1 host=node-b pid=4242`.
//!
//! The filter comes from RINGLEADER_LOG, in `tracing`'s `EnvFilter` syntax
//! (`info`, `ringleader_store=debug`, `off`); unset or empty, it is `warn`,
//! so warnings and errors are printed without any setting. The same variable
//! is the ranks' (they inherit it from `ringleader launch`).
//!
//! Every event leaves in one `write(2)` call: it is formatted whole into a
//! buffer ([`EventWriter`]), then written at once under the lock of stderr,
//! the lock the launcher's copies of rank output take for each of their
//! lines too ([`crate::launch::output`]). So a log line never lands inside a
//! rank's line, and with several processes on one terminal or pipe, lines
//! stay whole (a pipe keeps writes of up to `PIPE_BUF`, 4 KiB, together).

use std::fmt;
use std::io::{self, Write};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The variable that holds the filter.
pub(crate) const LOG_VAR: &str = "RINGLEADER_LOG";

/// The filter when RINGLEADER_LOG is unset or empty.
const DEFAULT_FILTER: &str = "warn";

/// Writes `line` and a newline to stderr in one `write_all` (one write(2)
/// for any line below the pipe's atomic size), holding the lock the
/// launcher's copies of rank output take too. Errors are ignored: a closed
/// stderr must not end the program.
pub(crate) fn stderr_line(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = io::stderr().lock().write_all(buf.as_bytes());
}

/// Installs the stderr subscriber for the subcommand `command` (`launch`,
/// `store`, ...), the name events of the command itself carry; the store's
/// carry `store`. A filter that does not parse is reported, and the default
/// used instead.
pub(crate) fn init(command: &'static str) {
    let (filter, complaint) = filter(std::env::var(LOG_VAR).ok().as_deref());
    let installed = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .event_format(LineFormat { command })
        .with_writer(StderrEvents)
        .try_init();
    if let (Some(complaint), Ok(())) = (complaint, installed) {
        tracing::warn!("{complaint}");
    }
}

/// The filter for a RINGLEADER_LOG value, and what is wrong with the value
/// when it does not parse (the default is used then).
fn filter(value: Option<&str>) -> (EnvFilter, Option<String>) {
    let value = value.map(str::trim).filter(|v| !v.is_empty());
    match value.map(EnvFilter::try_new) {
        None => (EnvFilter::new(DEFAULT_FILTER), None),
        Some(Ok(f)) => (f, None),
        Some(Err(e)) => (
            EnvFilter::new(DEFAULT_FILTER),
            Some(format!(
                "{LOG_VAR}={:?} is not a tracing filter ({e}); logging at {DEFAULT_FILTER}",
                value.unwrap_or_default()
            )),
        ),
    }
}

/// Where an event comes from, as its prefix says: `store` for the store's,
/// else the subcommand.
fn source(target: &str, command: &'static str) -> &'static str {
    if target == "ringleader_store" || target.starts_with("ringleader_store::") {
        "store"
    } else {
        command
    }
}

/// The level as a word: `error`, `warning`, `info`, `debug`, `trace`.
fn level_word(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// Formats an event as `[ringleader SOURCE] LEVEL: message k=v ... (span k=v ...)`:
/// the fields the default way, then the fields of the spans it is in
/// (the store's connection span names the peer and the rank). A message
/// of several lines keeps the prefix on each.
#[derive(Debug, Clone, Copy)]
struct LineFormat {
    /// The subcommand, for events that are not the store's.
    command: &'static str,
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut body = String::new();
        ctx.field_format().format_fields(Writer::new(&mut body), event)?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>().filter(|f| !f.is_empty()) {
                    body += &format!(" ({} {fields})", span.name());
                }
            }
        }
        let prefix = format!("[ringleader {}]", source(meta.target(), self.command));
        let mut lines = body.trim_end().lines();
        writeln!(writer, "{prefix} {}: {}", level_word(*meta.level()), lines.next().unwrap_or_default())?;
        for line in lines {
            writeln!(writer, "{prefix}   {line}")?;
        }
        Ok(())
    }
}

/// Hands each event an [`EventWriter`] on stderr.
#[derive(Debug, Clone, Copy)]
struct StderrEvents;

impl<'a> MakeWriter<'a> for StderrEvents {
    type Writer = EventWriter;

    fn make_writer(&'a self) -> EventWriter {
        EventWriter(Vec::with_capacity(256))
    }
}

/// Collects one formatted event, and writes it to stderr in one call when
/// dropped (whatever pieces the formatter wrote it in).
#[derive(Debug)]
struct EventWriter(Vec<u8>);

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            // A closed stderr loses the line; nothing better to do with it.
            let _ = io::stderr().lock().write_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what a subscriber writes, one entry per write.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<String>>>);

    struct CaptureWriter(Capture, Vec<u8>);

    impl Write for CaptureWriter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.1.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Drop for CaptureWriter {
        fn drop(&mut self) {
            self.0 .0.lock().unwrap().push(String::from_utf8_lossy(&self.1).into_owned());
        }
    }

    impl<'a> MakeWriter<'a> for Capture {
        type Writer = CaptureWriter;
        fn make_writer(&'a self) -> CaptureWriter {
            CaptureWriter(self.clone(), Vec::new())
        }
    }

    /// What `emit` logs, as `init` would format it, filtered by `filter`.
    fn logged(filter_value: Option<&str>, emit: impl FnOnce()) -> Vec<String> {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter(filter_value).0)
            .with_ansi(false)
            .event_format(LineFormat { command: "launch" })
            .with_writer(capture.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let out = capture.0.lock().unwrap().clone();
        out
    }

    #[test]
    fn store_warnings_carry_the_store_prefix_and_their_fields() {
        let got = logged(None, || {
            tracing::warn!(target: "ringleader_store::state::membership", rank = 1, host = "node-b", pid = 42, "rank vanished without leaving");
            tracing::warn!("endings will not be recorded");
            tracing::info!(target: "ringleader_store::server", "store listening");
        });
        assert_eq!(
            got,
            [
                "[ringleader store] warning: rank vanished without leaving rank=1 host=\"node-b\" pid=42\n",
                "[ringleader launch] warning: endings will not be recorded\n",
            ]
        );
    }

    #[test]
    fn span_fields_follow_and_each_line_is_prefixed() {
        let got = logged(Some("info"), || {
            let span = tracing::info_span!(target: "ringleader_store::server", "store_conn", conn = 3);
            let _in = span.enter();
            tracing::error!(target: "ringleader_store::server", "two\nlines");
        });
        assert_eq!(got, ["[ringleader store] error: two\n[ringleader store]   lines (store_conn conn=3)\n"]);
    }

    #[test]
    fn the_filter_comes_from_the_variable() {
        assert!(logged(Some("off"), || tracing::error!("x")).is_empty());
        assert_eq!(logged(Some("ringleader_store=debug"), || tracing::warn!("x")).len(), 0);
        assert_eq!(logged(Some(" "), || tracing::warn!("x")).len(), 1);
        let (_, complaint) = filter(Some("=[nonsense"));
        assert!(complaint.is_some_and(|c| c.contains(LOG_VAR)));
        assert!(filter(Some("info,ringleader_store=debug")).1.is_none());
    }
}
