//! The variables a session's `env` may not hold: those that make the dynamic loader, a shell, an
//! interpreter or a common tool run code — or load it from a path — of the environment's
//! choosing when it starts, before or instead of what it was asked to run.
//!
//! A session's `env` reaches the session's own commands only (the `shell` tool's `bash -c`):
//! code the tenant chose anyway. Nothing the operator runs gets it — a command tool starts with
//! the operator's environment (`toolexec_tools::operator::custom`), the sandbox's init with none. So this
//! list is a second layer, for the day something of the service or the operator runs in a
//! session's environment after all, and it keeps the record honest: with `BASH_ENV` set, the
//! log would say `ls` ran while a script ran first. Each refusal names the variable, the reason
//! and what to do instead (set it in the command, where it affects that command alone).
//!
//! docs/security.md ("A session's env") lists the families and the variables kept on purpose
//! (`PATH`, `HOME`, `EDITOR`, …) with why each is harmless.

/// Why `name` may not be in a session's `env` (the detail of a 422 `invalid_env`), or `None`.
pub(crate) fn refusal(name: &str) -> Option<String> {
    let why = reason(name)?;
    Some(format!(
        "env.{name}: {why}. A session's env may not hold it; set it in the command itself where one command needs it (e.g. \"{name}=… make test\", or `export {name}=…` in the command)"
    ))
}

fn reason(name: &str) -> Option<&'static str> {
    if is_loader_variable(name) {
        return Some(
            "variables of the dynamic loader and the C library (LD_*, GLIBC_TUNABLES, GCONV_PATH, MALLOC_*, …) change how every program starts",
        );
    }
    let any = |names: &[&str]| names.contains(&name);
    let prefixed = |prefixes: &[&str]| prefixes.iter().any(|p| name.starts_with(p));
    if any(SHELL) || prefixed(&["BASH_FUNC_"]) {
        return Some(
            "it makes a shell run code, or change how a script runs, when it starts (bash's BASH_ENV, sh's ENV, exported functions, xtrace with PS4, …)",
        );
    }
    if any(INTERPRETERS) || prefixed(&["LUA_INIT", "LUA_PATH", "LUA_CPATH"]) {
        return Some(
            "it makes an interpreter (Python, Perl, Ruby, Node.js, the JVM, Lua, PHP, R, Tcl) or OpenSSL load or run code from a place of the environment's choosing when it starts",
        );
    }
    if any(TOOLS) || prefixed(&["GIT_CONFIG"]) {
        return Some(
            "it makes git or less run a program, or read configuration that names one, of the environment's choosing",
        );
    }
    None
}

/// Shells: start-up files, options and prompts that run code or change how scripts run.
const SHELL: &[&str] = &[
    // bash runs the file named by BASH_ENV before every non-interactive script; sh (dash,
    // bash --posix) runs ENV in interactive shells; zsh reads $ZDOTDIR/.zshenv always.
    "BASH_ENV",
    "ENV",
    "ZDOTDIR",
    // Options imported at start-up (SHELLOPTS=xtrace makes PS4 expand, with `$(…)`).
    "SHELLOPTS",
    "BASHOPTS",
    // Prompts: command substitutions in them run (PS4 under xtrace, the others interactive).
    "PS0",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "PROMPT_COMMAND",
    "BASH_XTRACEFD",
    // How a script splits words, globs and changes directory (bash and dash reset IFS at
    // start-up; refused anyway, no program needs it from the environment).
    "IFS",
    "CDPATH",
    "GLOBIGNORE",
    // Where code is loaded from: builtins (`enable -f`), autoloaded functions (ksh, zsh), and
    // readline's start-up file.
    "BASH_LOADABLES_PATH",
    "FPATH",
    "INPUTRC",
];

/// Interpreters and libraries: a module or agent loaded at start-up, or the path code is loaded
/// from.
const INTERPRETERS: &[&str] = &[
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    // `-W action::category` imports the category's module.
    "PYTHONWARNINGS",
    "PYTHONEXECUTABLE",
    "PYTHONPLATLIBDIR",
    // Compiled modules read from a directory of the environment's choosing.
    "PYTHONPYCACHEPREFIX",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_REPL_EXTERNAL_MODULE",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "PHPRC",
    "PHP_INI_SCAN_DIR",
    "R_PROFILE",
    "R_PROFILE_USER",
    "R_ENVIRON",
    "R_ENVIRON_USER",
    "TCLLIBPATH",
    // An OpenSSL configuration loads engines and providers: shared objects.
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
];

/// Tools that run a program named by a variable, or read configuration that can name one
/// (`core.fsmonitor`, `core.sshCommand`, hooks).
const TOOLS: &[&str] = &[
    "GIT_DIR",
    "GIT_COMMON_DIR",
    "GIT_EXEC_PATH",
    "GIT_TEMPLATE_DIR",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_PROXY_COMMAND",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_PAGER",
    "GIT_EXTERNAL_DIFF",
    // less runs LESSOPEN's command on every file it opens.
    "LESSOPEN",
    "LESSCLOSE",
];

/// Variables the dynamic loader and the C library act on before a program's `main` or while it
/// runs (glibc's "unsecure" list, `UNSECURE_ENVVARS`, and its malloc settings), but `TMPDIR`,
/// which only names a directory and which build tools commonly need. The sandbox lets no
/// session variable reach a process outside it (its init is static and starts with an empty
/// environment); this is the second layer, so that a mistake there cannot turn into code run
/// outside the sandbox.
fn is_loader_variable(name: &str) -> bool {
    const NAMES: [&str; 12] = [
        "GLIBC_TUNABLES",
        "LOCALDOMAIN",
        "RES_OPTIONS",
        "TZDIR",
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCPATH",
        "NLSPATH",
        "NIS_PATH",
        "RESOLV_HOST_CONF",
        "MEMUSAGE_OUTPUT",
    ];
    name.starts_with("LD_") || name.starts_with("MALLOC_") || NAMES.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_up_hooks_are_refused_and_ordinary_variables_kept() {
        for name in [
            "BASH_ENV",
            "ENV",
            "BASH_FUNC_ls",
            "PS4",
            "SHELLOPTS",
            "PYTHONSTARTUP",
            "PERL5OPT",
            "NODE_OPTIONS",
            "LUA_INIT_5_4",
            "GIT_CONFIG_KEY_0",
            "GIT_CONFIG_PARAMETERS",
            "LD_AUDIT",
            "GLIBC_TUNABLES",
        ] {
            let why = refusal(name).unwrap_or_default();
            assert!(why.starts_with(&format!("env.{name}: ")), "{name}: {why}");
            assert!(why.contains("in the command"), "{why}");
        }
        for name in [
            "PATH",
            "HOME",
            "TMPDIR",
            "EDITOR",
            "PAGER",
            "SHELL",
            "NODE_ENV",
            "PYTHONUNBUFFERED",
            "PYTHONDONTWRITEBYTECODE",
            "GIT_AUTHOR_NAME",
            "LANG",
            "TZ",
            "HTTP_PROXY",
            "ENVIRONMENT",
            "PS",
        ] {
            assert_eq!(refusal(name), None, "{name}");
        }
    }
}
