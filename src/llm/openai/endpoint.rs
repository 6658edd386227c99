//! Where a route's requests go: the configured base URL, checked once, turned into the
//! chat-completions URL, and with any credentials it carries taken out of every form that can be
//! printed.
//!
//! A base URL may carry userinfo (`http://user:pass@host/v1`) and a query
//! (`https://host/openai?api-version=2024-06-01`). The path is joined with the `url` crate, so the
//! request goes to `<base path>/chat/completions` with the query kept (string concatenation would
//! append the path to the query). The userinfo never stays in the URL: it is removed before the URL
//! is used for anything, percent-decoded, and sent as HTTP Basic authorization. What may be printed
//! or logged — the shown base (`Display`), the request URL, `Debug`, and an error about a URL that
//! does not even parse (`redact_userinfo`) — has no userinfo in it, so a password in `--base-url`
//! never reaches stderr, a tracing field or the session log.
//!
//! Called by `OpenAiProvider::new` (once per provider) and by `OpenAiConfig`'s `Debug`.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::percent_decode_str;
use reqwest::Url;

use super::config::OpenAiError;

/// What stands in for removed userinfo in a URL shown in an error about a URL that did not parse.
const USERINFO_REDACTED: &str = "<redacted>@";

/// Credentials a base URL carried in its userinfo, percent-decoded, for HTTP Basic authorization.
///
/// `Debug` never shows the password.
#[derive(Clone)]
pub(crate) struct BasicCredentials {
    /// The user name (may be empty, as in `http://:token@host`).
    pub(crate) username: String,
    /// The password, if the userinfo had a `:`.
    pub(crate) password: Option<String>,
    /// The password as it appeared in the URL, still percent-encoded; scrubbed from server text too.
    password_encoded: Option<String>,
}

impl BasicCredentials {
    /// Replaces the password (decoded or as written in the URL) in `text` with `<redacted>`.
    pub(crate) fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in [&self.password, &self.password_encoded]
            .into_iter()
            .flatten()
        {
            if !secret.is_empty() && out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), "<redacted>"));
            }
        }
        out
    }
}

impl fmt::Debug for BasicCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicCredentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A checked base URL: the chat-completions URL to post to, the base as it may be shown, and the
/// credentials the base URL carried.
///
/// Invariant: neither `url` nor `shown` contains userinfo or a fragment.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    /// `<base path>/chat/completions`, with the base's query.
    url: Url,
    /// The base URL for messages and logs: no userinfo, no fragment, no trailing `/` on the path.
    shown: String,
    /// The base URL's userinfo, if it had any.
    credentials: Option<BasicCredentials>,
}

impl Endpoint {
    /// Checks `base_url` and derives the request URL from it.
    ///
    /// # Errors
    /// `InvalidBaseUrl` (showing the URL without its userinfo) when it does not parse, is not http
    /// or https, or has userinfo that is not UTF-8 once percent-decoded.
    pub(crate) fn parse(base_url: &str) -> Result<Endpoint, OpenAiError> {
        let invalid = |reason: String| OpenAiError::InvalidBaseUrl {
            base_url: redact_userinfo(base_url).into_owned(),
            reason,
        };
        let mut base = Url::parse(base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(invalid(format!("scheme {:?}", base.scheme())));
        }
        let credentials = take_credentials(&mut base).map_err(invalid)?;
        base.set_fragment(None);
        let path = base.path().trim_end_matches('/').to_owned();
        let mut shown = base[..url::Position::BeforePath].to_owned();
        shown.push_str(&path);
        if let Some(query) = base.query() {
            shown.push('?');
            shown.push_str(query);
        }
        let mut url = base;
        url.set_path(&format!("{path}/chat/completions"));
        Ok(Endpoint {
            url,
            shown,
            credentials,
        })
    }

    /// The URL each request is posted to.
    pub(crate) fn url(&self) -> &Url {
        &self.url
    }

    /// The credentials from the base URL's userinfo, if any.
    pub(crate) fn credentials(&self) -> Option<&BasicCredentials> {
        self.credentials.as_ref()
    }
}

impl fmt::Display for Endpoint {
    /// The base URL as failure messages and logs show it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

/// Removes the userinfo from `url` and returns it decoded (`None` when there was none).
fn take_credentials(url: &mut Url) -> Result<Option<BasicCredentials>, String> {
    if url.username().is_empty() && url.password().is_none() {
        return Ok(None);
    }
    let decode = |part: &str, what: &str| {
        percent_decode_str(part)
            .decode_utf8()
            .map(Cow::into_owned)
            .map_err(|_| format!("the {what} in the url is not UTF-8 once percent-decoded"))
    };
    let credentials = BasicCredentials {
        username: decode(url.username(), "user name")?,
        password: url.password().map(|p| decode(p, "password")).transpose()?,
        password_encoded: url.password().map(str::to_owned),
    };
    // Neither call can fail on an http(s) URL, which always has a host.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    Ok(Some(credentials))
}

/// Whether `base_url` carries userinfo (credentials for HTTP Basic authorization). A URL that does
/// not parse is judged textually, as `redact_userinfo` does, so one with userinfo still counts: its
/// caller then reports the URL's error rather than a missing key.
pub(crate) fn has_userinfo(base_url: &str) -> bool {
    match Url::parse(base_url) {
        Ok(url) => !url.username().is_empty() || url.password().is_some(),
        Err(_) => matches!(redact_userinfo(base_url), Cow::Owned(_)),
    }
}

/// `raw` with the userinfo of its authority replaced by `<redacted>@`, found textually so it works
/// on a URL that does not parse: the authority runs from `://` to the first `/`, `?` or `#`, and
/// its userinfo is everything up to its last `@`.
pub(crate) fn redact_userinfo(raw: &str) -> Cow<'_, str> {
    let Some(scheme_end) = raw.find("://") else {
        return Cow::Borrowed(raw);
    };
    let authority_start = scheme_end + 3;
    let authority_len = raw[authority_start..]
        .find(['/', '?', '#'])
        .unwrap_or(raw.len() - authority_start);
    let authority = &raw[authority_start..authority_start + authority_len];
    match authority.rfind('@') {
        Some(at) => Cow::Owned(format!(
            "{}{USERINFO_REDACTED}{}",
            &raw[..authority_start],
            &raw[authority_start + at + 1..]
        )),
        None => Cow::Borrowed(raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Endpoint {
        Endpoint::parse(raw).expect("valid base url")
    }

    #[test]
    fn the_path_is_joined_before_the_query() {
        let e = parse("http://h/v1?api-version=X");
        assert_eq!(
            e.url().as_str(),
            "http://h/v1/chat/completions?api-version=X"
        );
        assert_eq!(e.to_string(), "http://h/v1?api-version=X");
        let e = parse("https://h:8443/openai/deployments/d/?api-version=2024-06-01&x=1#frag");
        assert_eq!(
            e.url().as_str(),
            "https://h:8443/openai/deployments/d/chat/completions?api-version=2024-06-01&x=1"
        );
        assert_eq!(
            e.to_string(),
            "https://h:8443/openai/deployments/d?api-version=2024-06-01&x=1"
        );
    }

    #[test]
    fn trailing_slashes_and_bare_hosts_join_as_before() {
        for (raw, url, shown) in [
            (
                "http://127.0.0.1:9",
                "http://127.0.0.1:9/chat/completions",
                "http://127.0.0.1:9",
            ),
            (
                "http://127.0.0.1:9/",
                "http://127.0.0.1:9/chat/completions",
                "http://127.0.0.1:9",
            ),
            (
                "http://h/v1/",
                "http://h/v1/chat/completions",
                "http://h/v1",
            ),
            (
                "http://h/v1//",
                "http://h/v1/chat/completions",
                "http://h/v1",
            ),
            (
                "https://api.deepseek.com",
                "https://api.deepseek.com/chat/completions",
                "https://api.deepseek.com",
            ),
        ] {
            let e = parse(raw);
            assert_eq!(
                (e.url().as_str(), e.to_string().as_str()),
                (url, shown),
                "{raw}"
            );
            assert!(e.credentials().is_none(), "{raw}");
        }
    }

    #[test]
    fn userinfo_is_taken_out_and_decoded() {
        let e = parse("http://us%40er:p%3Ass@h:1/v1?k=v");
        assert_eq!(e.url().as_str(), "http://h:1/v1/chat/completions?k=v");
        assert_eq!(e.to_string(), "http://h:1/v1?k=v");
        assert_eq!(e.to_string(), "http://h:1/v1?k=v");
        let c = e.credentials().expect("credentials");
        assert_eq!(
            (c.username.as_str(), c.password.as_deref()),
            ("us@er", Some("p:ss"))
        );
        assert_eq!(
            c.scrub("echo p:ss and p%3Ass"),
            "echo <redacted> and <redacted>"
        );
        assert!(!format!("{e:?}").contains("p%3Ass"), "{e:?}");
        assert!(!format!("{e:?}").contains("p:ss"), "{e:?}");
        let c = parse("http://token@h/")
            .credentials()
            .cloned()
            .expect("user only");
        assert_eq!((c.username.as_str(), c.password), ("token", None));
        assert!(has_userinfo("http://token@h/"));
        assert!(!has_userinfo("http://h/"));
        assert!(!has_userinfo("not a url"));
        assert!(has_userinfo("http://a:b@h:99999/"));
        assert!(
            !has_userinfo("http://@h/"),
            "an empty userinfo is no credential"
        );
        assert!(parse("http://@h/").credentials().is_none());
    }

    #[test]
    fn errors_never_show_the_userinfo() {
        for raw in [
            "http://user:s3cret@h:99999/",
            "ftp://user:s3cret@h/",
            "http://user:s3cret@/x",
            "http://user:%FF%FEs3cret@h/",
        ] {
            let err = Endpoint::parse(raw).expect_err("invalid");
            let text = err.to_string();
            assert!(!text.contains("s3cret"), "{text}");
            assert!(text.contains("<redacted>@"), "{text}");
        }
    }

    #[test]
    fn redaction_is_textual_and_only_in_the_authority() {
        assert_eq!(
            redact_userinfo("http://a:b@h/p@q"),
            "http://<redacted>@h/p@q"
        );
        assert_eq!(
            redact_userinfo("http://a:b@c@h?x@y"),
            "http://<redacted>@h?x@y"
        );
        assert_eq!(redact_userinfo("http://h/p@q"), "http://h/p@q");
        assert_eq!(redact_userinfo("no scheme a:b@h"), "no scheme a:b@h");
        assert_eq!(redact_userinfo("http://a:b@h"), "http://<redacted>@h");
    }
}
