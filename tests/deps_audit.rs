//! Every external program that the tests, benchmarks and scripts run is installed by
//! `scripts/deps` (its table `program package`). On CI's machine a program installed
//! by hand hides a missing install step; this test does not depend on what the
//! machine has: it reads the sources.
//!
//! Found in Rust: `Command::new("X")`, calls of wrappers that spawn their first
//! argument (`fn sh(args: &[&str]) { Command::new(args[0]) … }`, `run("X", …)`), and
//! `ip netns exec NS X` forms. Found in shell: the command word of each simple
//! command, less keywords, builtins and the script's own functions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `scripts/deps`'s table: program → package (`-` for the toolchain).
fn deps_table() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join("scripts/deps")).unwrap();
    let body = text
        .split("programs=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("scripts/deps has a programs=\"…\" table");
    body.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn is_shell(path: &Path, text: &str) -> bool {
    path.extension().is_some_and(|e| e == "sh")
        || text.starts_with("#!/usr/bin/env bash")
        || text.starts_with("#!/bin/bash")
        || text.starts_with("#!/bin/sh")
}

/// Functions of a Rust source that run their argument: one whose parameter becomes
/// the program, or is appended to `ip netns exec NS`.
fn rust_wrappers(text: &str) -> BTreeSet<String> {
    let func = Regex::new(r"fn\s+([a-z_][a-z0-9_]*)\s*(?:<[^>]*>)?\(([^)]*)\)").unwrap();
    let mut wrappers = BTreeSet::new();
    let starts: Vec<_> = func.captures_iter(text).collect();
    for (i, c) in starts.iter().enumerate() {
        let params: Vec<String> = c[2]
            .split(',')
            .filter_map(|p| p.split(':').next())
            .map(|p| p.trim().trim_start_matches("mut ").to_string())
            .filter(|p| !p.is_empty())
            .collect();
        let body_start = c.get(0).unwrap().end();
        let body_end = starts
            .get(i + 1)
            .map(|n| n.get(0).unwrap().start())
            .unwrap_or(text.len());
        let body = &text[body_start..body_end];
        for p in &params {
            let spawns = body.contains(&format!("Command::new({p})"))
                || body.contains(&format!("Command::new({p}[0])"))
                || body.contains(&format!("Command::new(&{p})"));
            let appended_to_exec =
                body.contains("\"exec\"") && body.contains(&format!("extend_from_slice({p})"));
            if spawns || appended_to_exec {
                wrappers.insert(c[1].to_string());
            }
        }
    }
    wrappers
}

/// Programs a Rust source runs; `wrappers` are the functions (of any file) that
/// run their argument.
fn rust_programs(text: &str, wrappers: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let literal = Regex::new(r#"Command::new\(\s*"([^"]+)"\s*\)"#).unwrap();
    for c in literal.captures_iter(text) {
        found.insert(c[1].to_string());
    }
    // `ip netns exec NS X`: X runs too.
    let netns_exec = Regex::new(r#""exec",\s*[^,\]]+,\s*"([^"]+)""#).unwrap();
    for c in netns_exec.captures_iter(text) {
        found.insert(c[1].to_string());
    }
    let found_ok = |p: &String| p.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    for w in wrappers {
        // The first string literal of the call: `sh(&["nft", …])`,
        // `nsexec(&ns, &["ip", …])`, `run("ipvsadm", …)`.
        let call = Regex::new(&format!(
            r#"(?:^|[^a-z0-9_:]){w}\(\s*(?:[^()"\[]*?,\s*)?&?(?:vec!)?\[?\s*"([^"]+)""#
        ))
        .unwrap();
        for c in call.captures_iter(text) {
            found.insert(c[1].to_string());
        }
    }
    // A string may be a shell command line (`sh -c "ipset restore …; ip …"`).
    found
        .into_iter()
        .flat_map(|p| {
            if p.contains(' ') {
                simple_commands(&p)
                    .iter()
                    .flat_map(|w| commands_of(w))
                    .collect()
            } else {
                vec![p]
            }
        })
        .filter(found_ok)
        .collect()
}

const SHELL_WORDS: &[&str] = &[
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "for",
    "in",
    "do",
    "done",
    "while",
    "until",
    "case",
    "esac",
    "function",
    "select",
    "time",
    "echo",
    "printf",
    "cd",
    "set",
    "export",
    "local",
    "read",
    "return",
    "exit",
    "shift",
    "trap",
    "wait",
    "test",
    "true",
    "false",
    "source",
    "declare",
    "eval",
    "unset",
    "exec",
    "command",
    "mapfile",
    "readarray",
    "kill",
    "pwd",
    "break",
    "continue",
    "let",
    "type",
    "ulimit",
    "umask",
    "getopts",
    "builtin",
    "hash",
    "printenv",
    "wait",
    "disown",
    "jobs",
    "fg",
    "bg",
    "alias",
    "readonly",
    "typeset",
    "pushd",
    "popd",
    "dirs",
    "shopt",
    "caller",
    "compgen",
];

/// Programs a shell script runs: the command word of each simple command (outside
/// quotes, comments and here-documents; inside `$(…)` too), less keywords,
/// builtins and the script's own functions.
fn shell_programs(text: &str) -> BTreeSet<String> {
    let func =
        Regex::new(r"(?m)^\s*(?:function\s+)?([A-Za-z_][A-Za-z0-9_-]*)\s*\(\)\s*\{").unwrap();
    let mut own = BTreeSet::new();
    // Functions that run their arguments (`"$@"` as a command) after `shift N`:
    // `wait_until 60 etcd curl …` (shift 2) runs curl.
    let mut runners = BTreeMap::new();
    let shift = Regex::new(r"(?m)^\s*shift(?:\s+([0-9]+))?\s*$").unwrap();
    for c in func.captures_iter(text) {
        let name = c[1].to_string();
        let brace = c.get(0).unwrap().end() - 1;
        let chars: Vec<char> = text[brace..].chars().collect();
        let body: String = chars[..skip_balanced(&chars, 0, '{', '}')].iter().collect();
        if simple_commands(&body)
            .iter()
            .any(|words| commands_of(words).iter().any(|w| w == "\"$@\""))
        {
            let skip = shift
                .captures(&body)
                .map_or(0, |c| c.get(1).map_or(1, |n| n.as_str().parse().unwrap()));
            runners.insert(name.clone(), skip);
        }
        own.insert(name);
    }
    let word = Regex::new(r"^[a-z][a-z0-9_.+-]*$").unwrap();
    let mut found = BTreeSet::new();
    for words in simple_commands(text) {
        let commands = commands_of(&words);
        if let Some((runner, skip)) = commands.iter().find_map(|w| runners.get_key_value(w)) {
            let at = words.iter().position(|w| w == runner).unwrap_or(0);
            if let Some(run) = words.get(at + 1 + skip) {
                found.insert(run.clone());
            }
        }
        found.extend(commands);
    }
    found.retain(|w| word.is_match(w) && !SHELL_WORDS.contains(&w.as_str()) && !own.contains(w));
    found
}

/// Words before the command: it follows them (`timeout 5 CMD`, `env A=b CMD`).
const PREFIXES: &[&str] = &[
    "if", "then", "else", "elif", "do", "while", "until", "!", "exec", "time", "env", "nice",
    "xargs", "setsid", "timeout", "command", "flock",
];

/// The command words of one simple command's words: the first that is not an
/// assignment, an option or a prefix's argument; with `ip netns exec NS CMD`,
/// CMD too; the prefixes that are programs themselves (`env`, `timeout`).
fn commands_of(words: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        let prev = i.checked_sub(1).map(|p| words[p].as_str());
        let prefix_arg = matches!(prev, Some("timeout" | "nice" | "flock"))
            && (w.starts_with('-')
                || w.chars()
                    .all(|c| c.is_ascii_digit() || c == '.' || c == 's' || c == 'm'));
        if (w.contains('=') && !w.starts_with('=')) || w.starts_with('-') || prefix_arg {
            i += 1;
            continue;
        }
        out.push(w.clone());
        if w == "ip"
            && words.get(i + 1).map(String::as_str) == Some("netns")
            && words.get(i + 2).map(String::as_str) == Some("exec")
        {
            i += 4;
            continue;
        }
        if !PREFIXES.contains(&w.as_str()) {
            break;
        }
        i += 1;
    }
    out
}

/// The index after the `close` that matches the `open` at `at`.
fn skip_balanced(chars: &[char], at: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    let mut i = at;
    while i < chars.len() {
        if chars[i] == open {
            depth += 1;
        } else if chars[i] == close {
            depth -= 1;
            if depth == 0 {
                return i + 1;
            }
        }
        i += 1;
    }
    i
}

/// The simple commands of a script, each as its words. A small shell lexer: quotes, `$(…)` nesting,
/// `$((…))`, `#` comments, here-documents, `;`, `|`, `&`, newlines, `case`
/// patterns.
fn simple_commands(text: &str) -> Vec<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Ctx {
        Normal,
        Double,
    }
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    // Each open command substitution keeps the words of its command.
    let mut stack: Vec<(Ctx, Vec<String>)> = vec![(Ctx::Normal, Vec::new())];
    let mut heredocs: Vec<String> = Vec::new();
    let mut i = 0;
    let end_command = |words: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if !words.is_empty() {
            out.push(std::mem::take(words));
        }
    };
    while i < chars.len() {
        let ctx = stack.last().unwrap().0;
        let c = chars[i];
        if ctx == Ctx::Double {
            match c {
                '\\' => i += 2,
                '"' => {
                    stack.pop();
                    i += 1;
                }
                '$' if chars.get(i + 1) == Some(&'(') && chars.get(i + 2) != Some(&'(') => {
                    stack.push((Ctx::Normal, Vec::new()));
                    i += 2;
                }
                _ => i += 1,
            }
            continue;
        }
        let depth = stack.len();
        let words = &mut stack.last_mut().unwrap().1;
        match c {
            '\\' => i += 2,
            '\'' => {
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                words.push("'…'".into());
            }
            '"' => {
                // `"$@"` stays itself: a function that runs its arguments.
                let quoted: String = chars[i..(i + 4).min(chars.len())].iter().collect();
                words.push(if quoted == "\"$@\"" {
                    quoted
                } else {
                    "\"…\"".into()
                });
                stack.push((Ctx::Double, Vec::new()));
                i += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\n' => {
                i += 1;
                end_command(words, &mut out);
                // Here-documents begin on the next line.
                for end in std::mem::take(&mut heredocs) {
                    while i < chars.len() {
                        let line_end = chars[i..]
                            .iter()
                            .position(|&c| c == '\n')
                            .map_or(chars.len(), |p| i + p);
                        let line: String = chars[i..line_end].iter().collect();
                        i = (line_end + 1).min(chars.len());
                        if line.trim() == end {
                            break;
                        }
                    }
                }
            }
            ';' | '|' | '&' | '(' | '{' | '}' | '`' => {
                i += 1;
                end_command(words, &mut out);
            }
            ')' => {
                i += 1;
                end_command(words, &mut out);
                if stack.len() > 1 {
                    stack.pop();
                }
            }
            '$' if chars.get(i + 1) == Some(&'{') => {
                i = skip_balanced(&chars, i + 1, '{', '}');
                words.push("${…}".into());
            }
            '$' if chars.get(i + 1) == Some(&'(') && chars.get(i + 2) != Some(&'(') => {
                words.push("$(…)".into());
                stack.push((Ctx::Normal, Vec::new()));
                i += 2;
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                // $(( arithmetic ))
                let mut depth = 0;
                while i < chars.len() {
                    match chars[i] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                i += 1;
                words.push("$((…))".into());
            }
            '<' if chars.get(i + 1) == Some(&'<') && chars.get(i + 2) != Some(&'<') => {
                i += 2;
                if chars.get(i) == Some(&'-') {
                    i += 1;
                }
                while chars.get(i) == Some(&' ') {
                    i += 1;
                }
                let mut end = String::new();
                while let Some(&c) = chars.get(i) {
                    match c {
                        '\'' | '"' => {}
                        c if c.is_alphanumeric() || c == '_' => end.push(c),
                        _ => break,
                    }
                    i += 1;
                }
                if !end.is_empty() {
                    heredocs.push(end);
                }
                words.push("<<".into());
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                let start = i;
                let expansion = |i: usize| {
                    i > start && chars[i] == '$' && matches!(chars.get(i + 1), Some('(' | '{'))
                };
                while i < chars.len()
                    && !chars[i].is_whitespace()
                    && !matches!(chars[i], ';' | '|' | '&' | '(' | ')' | '`' | '"' | '\'')
                    && !expansion(i)
                {
                    i += 1;
                }
                if i < chars.len() && chars[i] == '$' {
                    // `x=$(…)`, `x=${…}`: the expansion is read next.
                    let w: String = chars[start..i].iter().collect();
                    words.push(format!("{w}…"));
                    continue;
                }
                let w: String = chars[start..i].iter().collect();
                if w.ends_with('=') && chars.get(i) == Some(&'(') {
                    // An array assignment: `x=(a b)`.
                    i = skip_balanced(&chars, i, '(', ')');
                    words.push(format!("{w}(…)"));
                    continue;
                }
                // A `case` pattern (`pattern)`, `a|b)`): not a command.
                let pattern_end = chars[i..]
                    .iter()
                    .take_while(|c| **c != '\n' && **c != ' ')
                    .position(|c| *c == ')');
                let case_pattern = depth == 1
                    && words.is_empty()
                    && pattern_end.is_some_and(|p| {
                        chars[i..i + p]
                            .iter()
                            .all(|c| *c == '|' || !c.is_whitespace())
                            && !chars[i..i + p].contains(&'(')
                    });
                if case_pattern {
                    let p = pattern_end.unwrap();
                    i += p + 1;
                    continue;
                }
                if matches!(chars.get(i), Some('"') | Some('\'')) {
                    // Glued to a quote (`x="…"`): one word, and not a command.
                    words.push(format!("{w}…"));
                    continue;
                }
                words.push(w);
            }
        }
    }
    for (_, mut words) in stack {
        end_command(&mut words, &mut out);
    }
    out
}

/// Every program that `tests/`, `benches/`, `netlink/tests`, `vm-tests/`, `scripts/`,
/// `testenv/build` and `.ci/run` run, with the files that run it.
fn programs_run() -> BTreeMap<String, BTreeSet<String>> {
    let root = repo();
    let mut files = Vec::new();
    for dir in ["tests", "benches", "netlink/tests", "vm-tests", "scripts"] {
        files_under(&root.join(dir), &mut files);
    }
    files.push(root.join("testenv/build"));
    files.push(root.join(".ci/run"));
    // The shared test helpers' wrappers apply to every test; a file's own, to it.
    let mut shared = BTreeSet::new();
    for path in files
        .iter()
        .filter(|p| p.starts_with(root.join("tests/common")))
    {
        shared.extend(rust_wrappers(
            &std::fs::read_to_string(path).unwrap_or_default(),
        ));
    }
    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let programs = if path.extension().is_some_and(|e| e == "rs") {
            let mut wrappers = rust_wrappers(&text);
            wrappers.extend(shared.iter().cloned());
            rust_programs(&text, &wrappers)
        } else if is_shell(&path, &text) {
            shell_programs(&text)
        } else {
            continue;
        };
        let rel = path.strip_prefix(&root).unwrap().display().to_string();
        if rel == "tests/deps_audit.rs" {
            continue; // its own test strings
        }
        for p in programs {
            found.entry(p).or_default().insert(rel.clone());
        }
    }
    found
}

/// Programs that are not packages: testenv's builds and this repository's binary.
const NOT_PACKAGES: &[(&str, &str)] = &[
    ("kube-nlproxy", "this repository's binary"),
    ("kube-apiserver", "testenv/build"),
    ("kube-controller-manager", "testenv/build"),
    ("kube-proxy", "testenv/build"),
    ("kubectl", "testenv/build"),
    ("etcd", "testenv/build"),
];

#[test]
fn scripts_deps_installs_every_program_the_tests_run() {
    let table = deps_table();
    let found = programs_run();
    // The audit finds what we know the tests run: it is not vacuous.
    for known in [
        "ip",
        "nft",
        "ipset",
        "conntrack",
        "strace",
        "openssl",
        "curl",
    ] {
        assert!(
            found.contains_key(known),
            "the audit no longer finds `{known}` (found: {:?})",
            found.keys().collect::<Vec<_>>()
        );
    }
    let mut missing = Vec::new();
    for (program, files) in &found {
        if table.contains_key(program) || NOT_PACKAGES.iter().any(|(p, _)| p == program) {
            continue;
        }
        missing.push(format!("{program} (run by {files:?})"));
    }
    println!("programs run by tests, benches and scripts: {found:#?}");
    assert!(
        missing.is_empty(),
        "scripts/deps does not install:\n  {}\nadd each to its table (program package)",
        missing.join("\n  ")
    );
}

#[test]
fn the_audit_reads_each_form() {
    let rust = r#"
        fn sh(args: &[&str]) -> String { let out = Command::new(args[0]).output(); }
        fn nsexec(ns: &str, args: &[&str]) -> Output {
            let mut v = vec!["ip", "netns", "exec", ns];
            v.extend_from_slice(args);
            sh_out(&v)
        }
        fn t() { sh(&["nft", "list"]); nsexec(&ns, &["conntrack", "-L"]); Command::new("ipset"); }
        fn k() { Command::new("ip").args(["netns", "exec", &self.netns, "kubectl"]); }
    "#;
    let got = rust_programs(rust, &rust_wrappers(rust));
    for p in ["nft", "conntrack", "ipset", "ip", "kubectl"] {
        assert!(got.contains(p), "{p} not found in {got:?}");
    }
    let shell = "#!/usr/bin/env bash\nset -e\nfoo() { jq . x; }\nw() {\n  local n=$1\n  shift\n  if \"$@\"; then :; fi\n}\nw 5 sleepy -x\nif ! command -v qemu >/dev/null; then\n  x=$(openssl rand 4) && curl -s a | sha256sum\nfi\ncat <<EOF\nnotaprogram here\nEOF\nip netns exec ns iperf3 -s # comment\nfoo\n";
    let got = shell_programs(shell);
    for p in [
        "jq",
        "openssl",
        "curl",
        "sha256sum",
        "cat",
        "ip",
        "iperf3",
        "sleepy",
    ] {
        assert!(got.contains(p), "{p} not found in {got:?}");
    }
    for p in ["foo", "notaprogram", "set", "command", "comment"] {
        assert!(!got.contains(p), "{p} wrongly found in {got:?}");
    }
}
