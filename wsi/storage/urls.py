"""URLs of slides, bags and output folders: told apart from local paths, checked, and never stored with
credentials.

A `Url` is a `str` (so `str(source.path)` in a manifest, a tile file's `slide_path` and a bag's provenance
is the URL itself, and the next stage opens it again) with the few path properties the stages read
(`name`, `suffix`, `stem`, `/`). It is made only by `parse_url`, which refuses a URL that carries a
secret: a user:password part (`s3://KEY:SECRET@bucket/...`) or a signed query (`?X-Amz-Signature=...`,
`?sig=...`). Such a URL would be written into every tile file, bag, manifest and run record; and one
that expires would not open again in the next stage. Credentials come from the standard places instead
(environment, profiles, instance roles; README "Slides and outputs in object storage").

`redact(text)` masks anything of that kind in a message (user:password, signed query values, and the
values of the credential variables set in the environment), so an error from a storage library never
carries a secret into a log or manifest.
"""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import parse_qsl, urlsplit

from wsi.core.errors import StorageError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: query parameters that hold a secret (presigned S3 / GCS URLs, Azure SAS, tokens)
_SECRET_PARAM = re.compile(r"(signature|sig|token|credential|secret|password|passwd|key|auth)", re.I)
#: user[:password]@ after a scheme; a password may hold '/' (AWS secret keys do), so a part with a ':'
#: runs to the '@' even across slashes
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?:[^/@\s]*|[^/@\s:]*:[^@\s]*)@")
#: the same after a path library folded '//' to '/' (Path("s3://K:S@b/x") prints s3:/K:S@b/x)
_USERINFO_FOLDED = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*:/)(?:[^/@\s]*:[^@\s]*)@")
_QUERY_SECRET = re.compile(
    r"(?P<name>[?&][^=&\s]*(?:signature|sig|token|credential|secret|password|passwd|key|auth)[^=&\s]*=)"
    r"[^&\s]*",
    re.I,
)
#: environment variables whose values are secrets (their values are masked in every message)
SECRET_VARIABLES = (
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID",
    "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_CLIENT_SECRET", "GOOGLE_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
)  # fmt: skip
#: `file://` is a local path, not a remote location
LOCAL_SCHEMES = frozenset({"file", "local"})


class Url(str):
    """A remote location without credentials (made by `parse_url`); a str with a path's few properties."""

    __slots__ = ()

    @property
    def scheme(self) -> str:
        return self.split("://", 1)[0].lower()

    @property
    def name(self) -> str:
        return posixpath.basename(self.rstrip("/"))

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    @property
    def stem(self) -> str:
        return posixpath.splitext(self.name)[0]

    @property
    def parent(self) -> Url:
        scheme, rest = self.split("://", 1)
        head = posixpath.dirname(rest.rstrip("/"))
        return Url(f"{scheme}://{head or rest.split('/', 1)[0]}")

    def __truediv__(self, part: str) -> Url:
        return join(self, part)

    def relative_to(self, base: str) -> str:
        """This URL's path below `base` (a folder URL), as a POSIX relative path."""
        root = base.rstrip("/") + "/"
        if not self.startswith(root):
            raise ValueError(f"{self} is not inside {base}")
        return self[len(root) :]


def is_url(text: object) -> bool:
    """Whether `text` is a remote URL (`s3://`, `gs://`, `https://`, ...); `file://` and paths are not."""
    if isinstance(text, Url):
        return True
    if not isinstance(text, str):
        return False
    m = _SCHEME.match(text)
    return m is not None and m.group(1).lower() not in LOCAL_SCHEMES


def parse_url(text: str, *, what: str = "location") -> Url:
    """`text` as a Url; StorageError (naming the URL with its secret masked) when it carries credentials."""
    if not is_url(text):
        raise StorageError(f"{redact(text)}: not a URL (scheme://...) for the {what}")
    if isinstance(text, Url):
        return text
    parts = urlsplit(text)
    if "@" in parts.netloc or _USERINFO.match(text):
        raise StorageError(
            f"{redact(text)}: the {what} URL holds credentials (user:password@), which would be written "
            f"into every output that names it; remove them and {credential_hint(parts.scheme)}"
        )
    secret = [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if _SECRET_PARAM.search(k)]
    if secret:
        raise StorageError(
            f"{redact(text)}: the {what} URL is signed ({', '.join(secret)}): the signature would be stored "
            "in every output that names it, and it expires before the next stage opens the file; give the "
            f"plain location and {credential_hint(parts.scheme)}"
        )
    if not parts.netloc:
        raise StorageError(f"{text}: no bucket or host in the {what} URL (e.g. s3://bucket/folder/)")
    scheme = parts.scheme.lower()
    return Url(f"{scheme}://{text.split('://', 1)[1]}")


def join(base: str, *parts: str) -> Url:
    """`base` (a folder URL) / parts, with exactly one slash between them."""
    out = str(base).rstrip("/")
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = f"{out}/{part}"
    return Url(out)


def redact(text: object) -> str:
    """`text` with user:password parts of URLs, signed query values and the values of credential variables
    in the environment replaced by ***: the one filter for messages that may quote a storage library."""
    out = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", str(text))
    out = _USERINFO_FOLDED.sub(lambda m: f"{m.group('scheme')}***@", out)
    out = _QUERY_SECRET.sub(lambda m: f"{m.group('name')}***", out)
    for name in SECRET_VARIABLES:
        value = os.environ.get(name, "")
        if len(value) >= 8:  # a short value would mask ordinary words
            out = out.replace(value, "***")
    return out


def credential_hint(scheme: str) -> str:
    """Where the credentials of `scheme` come from, as a fix to tell the user."""
    scheme = scheme.lower()
    if scheme in ("s3", "s3a"):
        return (
            "give credentials the standard way: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, AWS_PROFILE "
            "(~/.aws/credentials) or the machine's instance role; AWS_ENDPOINT_URL for MinIO or another "
            "S3-compatible server"
        )
    if scheme in ("gs", "gcs"):
        return (
            "give credentials the standard way: GOOGLE_APPLICATION_CREDENTIALS or "
            "`gcloud auth application-default login`"
        )
    if scheme in ("az", "abfs", "abfss"):
        return (
            "give credentials the standard way: AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_KEY, or "
            "`az login`"
        )
    if scheme in ("http", "https"):
        return "give credentials the standard way: ~/.netrc (machine HOST login USER password ...)"
    return "give credentials the way the storage's fsspec library reads them (environment or config file)"


__all__ = [
    "LOCAL_SCHEMES",
    "SECRET_VARIABLES",
    "Url",
    "credential_hint",
    "is_url",
    "join",
    "parse_url",
    "redact",
]
