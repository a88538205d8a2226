package portdecl

import (
	"fmt"
	"strings"
)

// What a stack's env file may hold (docs/env.md): it is read by `set -a; . env` in bash, dash and
// zsh, docker compose --env-file, python-dotenv, direnv's dotenv and node --env-file, often by a
// user other than the cockpit's owner who wrote the config. Each of those must run nothing and
// read each line as exactly the value written, and no line may change how the reader's programs
// are found, loaded or configured. So the config is refused when it would export anything else;
// nothing is quoted or escaped, since those readers do not agree on quotes.

// reservedNames are names shells, loaders, interpreters and everyday tools read to decide what to
// run, load or trust; reservedPrefixes start whole families of them. docs/env.md lists both.
var reservedNames = map[string]bool{
	// shells (bash, dash, zsh) and the login environment
	"PATH": true, "HOME": true, "SHELL": true, "IFS": true, "ENV": true, "CDPATH": true,
	"PS1": true, "PS2": true, "PS3": true, "PS4": true, "PROMPT_COMMAND": true, "SHELLOPTS": true,
	"GLOBIGNORE": true, "FPATH": true, "ZDOTDIR": true, "HISTFILE": true, "INPUTRC": true,
	"MAIL": true, "MAILPATH": true, "OPTIND": true, "OPTARG": true, "PPID": true, "UID": true,
	"EUID": true, "SHLVL": true, "PWD": true, "OLDPWD": true, "USER": true, "LOGNAME": true,
	"TERM": true, "TERMINFO": true, "TERMCAP": true, "TMPDIR": true, "TMP": true, "TEMP": true,
	"TZ": true, "TZDIR": true, "LANG": true, "LANGUAGE": true, "POSIXLY_CORRECT": true,
	"DISPLAY": true, "XAUTHORITY": true, "DBUS_SESSION_BUS_ADDRESS": true,
	// the C library
	"LOCPATH": true, "NLSPATH": true, "GCONV_PATH": true, "HOSTALIASES": true, "RES_OPTIONS": true,
	"LOCALDOMAIN": true, "GLIBC_TUNABLES": true,
	// programs that others start for you
	"EDITOR": true, "VISUAL": true, "PAGER": true, "MANPAGER": true, "BROWSER": true,
	"LESS": true, "LESSOPEN": true, "LESSCLOSE": true, "VIMINIT": true, "EXINIT": true,
	"MYVIMRC": true, "VIMRUNTIME": true, "GVIMINIT": true, "SUDO_ASKPASS": true,
	"MANPATH": true, "INFOPATH": true, "GNUPGHOME": true, "KUBECONFIG": true,
	// compilers, build tools and package managers
	"CC": true, "CXX": true, "CPP": true, "LD": true, "AR": true, "CFLAGS": true, "CXXFLAGS": true,
	"CPPFLAGS": true, "LDFLAGS": true, "MAKE": true, "MAKEFLAGS": true, "MFLAGS": true,
	"CLASSPATH": true, "PKG_CONFIG_PATH": true, "PHPRC": true, "PHP_INI_SCAN_DIR": true,
	"VIRTUAL_ENV": true, "REQUESTS_CA_BUNDLE": true, "CURL_CA_BUNDLE": true, "CURL_HOME": true,
	"WGETRC": true, "R_PROFILE": true, "R_PROFILE_USER": true, "R_ENVIRON": true,
	"R_ENVIRON_USER": true, "R_LIBS": true, "R_LIBS_USER": true, "RUSTC": true, "RUSTC_WRAPPER": true,
	"RUSTFLAGS": true, "RUSTDOCFLAGS": true,
	"GOFLAGS": true, "GOPATH": true, "GOROOT": true, "GOPROXY": true, "GOBIN": true, "GOCACHE": true,
	"GOENV": true, "GOTOOLCHAIN": true, "GODEBUG": true, "GOEXPERIMENT": true, "GOMODCACHE": true,
	"GONOSUMDB": true, "GONOPROXY": true, "GOPRIVATE": true, "GOSUMDB": true, "GOINSECURE": true,
	"GOOS": true, "GOARCH": true, "GOWORK": true, "GOVCS": true, "GOAUTH": true, "GCCGO": true,
	"GOGC": true, "GOMAXPROCS": true, "GOMEMLIMIT": true, "GOTRACEBACK": true,
}

var reservedPrefixes = []string{
	"LD_", "DYLD_", "LC_", "BASH_", "MALLOC_", "XDG_", "SSH_", "GPG_",
	"PYTHON", "PERL", "RUBY", "GEM_", "BUNDLE_", "NODE_", "NPM_CONFIG_", "YARN_", "PNPM_",
	"GIT_", "CGO_", "CARGO_", "RUSTUP_", "JAVA_", "JDK_", "_JAVA_", "MAVEN_", "GRADLE_",
	"DOTNET_", "CORECLR_", "LUA_", "PIP_", "UV_", "POETRY_", "PIPENV_", "CONDA_", "COMPOSER_",
	"DOCKER_", "COMPOSE_", "DIRENV_", "OPENSSL_", "SSL_", "KRB5",
}

// reservedSuffixes end names of the same kind: HTTP_PROXY, HTTPS_PROXY, NO_PROXY route a
// reader's traffic.
var reservedSuffixes = []string{"_PROXY"}

// allowedNames are names of a reserved family that only name what a stack's tools make, and so
// choose nothing they run or load: compose's project name, the recipe docs/env.md gives.
var allowedNames = map[string]bool{"COMPOSE_PROJECT_NAME": true}

// Reserved says name is one a shell, loader, interpreter or everyday tool reads (docs/env.md).
func Reserved(name string) bool {
	if reservedNames[name] {
		return true
	}
	if allowedNames[name] {
		return false
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, s := range reservedSuffixes {
		if strings.HasSuffix(name, s) || name == s[1:] {
			return true
		}
	}
	return false
}

// CheckExported refuses a name the env file may not export, its message naming it: one no shell can assign (anything
// but [A-Za-z_][A-Za-z0-9_]*; `set -a; . env` would run such a line as a command) and one that
// is Reserved.
func CheckExported(name string) error {
	valid := name != "" && (name[0] < '0' || name[0] > '9')
	for _, c := range []byte(name) {
		valid = valid && (c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_')
	}
	if !valid {
		return fmt.Errorf("%q, which is not a variable name a shell assigns ([A-Za-z_][A-Za-z0-9_]*)", name)
	}
	if Reserved(name) {
		return fmt.Errorf("%s, which shells, loaders or interpreters read (docs/env.md): choose another name, or an [env] prefix", name)
	}
	return nil
}

// checkPath refuses an entrypoint path any env reader would not read as written: it is ASCII
// letters, digits and - . _ ~ / : @ + , = * ?, and % with two hex digits (write any other
// byte percent-encoded: %24 for $, %23 for #). Outside that set, a shell runs $(…), `…`, ;, &
// and |, and reads quotes and \; node and direnv end a value at #; and a ~ after : is a home
// directory to every shell.
func checkPath(path string) error {
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
		case c == '~' && i > 0 && path[i-1] == ':':
			return fmt.Errorf("%q has \"~\" after \":\" at byte %d, which shells read as a home directory: write %%7E", path, i)
		case strings.IndexByte("-._~/:@+,=*?", c) >= 0:
		case c == '%' && i+2 < len(path) && isHex(path[i+1]) && isHex(path[i+2]):
		default:
			what := fmt.Sprintf("byte 0x%02x", c)
			if c > ' ' && c < 0x7f {
				what = fmt.Sprintf("%q", string(c))
			}
			return fmt.Errorf("%q has %s at byte %d: a path is ASCII letters, digits, - . _ ~ / : @ + , = * ? and %%XX (percent-encode the rest)", path, what, i)
		}
	}
	return nil
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// CheckValue refuses an env value any env reader would not read as written: the values a config
// checkPath accepts yields (a port, a URL of a safe scheme, a loopback hostname and a checked
// path). It judges what an env file holds, whoever accepted the config.
func CheckValue(value string) error {
	scheme, rest, isURL := strings.Cut(value, "://")
	if !isURL {
		for _, c := range []byte(value) {
			if c < '0' || c > '9' {
				return fmt.Errorf("%q is neither a port nor a URL", value)
			}
		}
		return nil
	}
	if !validScheme(scheme) {
		return fmt.Errorf("%q has no URL scheme", value)
	}
	// An IPv6 loopback is [::1]; the rest is what checkPath accepts.
	return checkPath(strings.Replace(rest, ipv6Loopback, "", 1))
}
