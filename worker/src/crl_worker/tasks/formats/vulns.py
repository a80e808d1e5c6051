"""Record converters of the vulnerability datasets, each turning one record into a ``classify``
:class:`Task`: the repository at the vulnerable commit (the parent of the fixing commit), the
vulnerable location when the record names it, the function's code in the problem statement, and
the CWE label.

Formats (docs/task-types.md lists the fields each reads):

- ``bigvul``: Big-Vul (Fan et al., MSR 2020), its ``MSR_data_cleaned.csv`` rows as JSON or
  JSONL (also the Hugging Face exports that keep the column names): ``CWE ID``, ``CVE ID``,
  ``codeLink``, ``commit_id``, ``parentID``, ``file_name``, ``func_before``, ``vul``.
- ``cvefixes``: CVEfixes (Bhandari et al., PROMISE 2021), one row per vulnerable method of its
  SQLite tables joined (``method_change`` before the fix, ``file_change``, ``commits``,
  ``fixes``, ``cwe_classification``): ``cve_id``, ``cwe_id``, ``repo_url``, ``hash``,
  ``parents``, ``old_path``/``filename``, ``name``, ``code``, ``before_change``.
- ``primevul``: PrimeVul (Ding et al., ICSE 2025) JSONL: ``idx``, ``project_url`` or
  ``commit_url``, ``commit_id``, ``file_name``, ``func``, ``target``, ``cwe``, ``cve``.

Records that are not vulnerable (``vul``/``target`` 0, ``before_change`` false), that carry no
CWE id or one outside the shipped CWE list (NVD's ``NVD-CWE-Other``, a category such as
CWE-399), or whose repository is not on GitHub are errors naming the record and the field; the
others load.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from crl_worker.tasks.cwe import UnknownCweError, normalise
from crl_worker.tasks.formats.common import image_for
from crl_worker.tasks.model import Classification, Language, Task
from crl_worker.tasks.records import ConvertOptions, Record, RecordRef, string_list, text

_GITHUB = re.compile(
    r"^https?://(?:www\.)?github\.com/(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?"
    r"(?:/commit/(?P<commit>[0-9a-fA-F]{7,40})(?:\.patch|\.diff)?)?/?(?:[#?].*)?$"
)
#: Where a second URL starts in a field that holds several run together (Big-Vul's codeLink
#: does for CVEs fixed by several commits: ``.../commit/<a>https://github.com/.../commit/<b>``).
_NEXT_URL = re.compile(r"(?<=.)(?=https?://)")
_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")
_C_FAMILY = (".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh")
_LANGUAGES: dict[str, Language] = {
    ".py": "python",
    ".java": "java",
    ".js": "javascript",
    ".go": "go",
    ".rs": "rust",
}
#: Characters of a function's code the problem statement shows at most.
MAX_CODE = 40_000


def _github(
    url: str, ref: RecordRef, field: str, commit: str | None = None
) -> tuple[str, str | None]:
    """The repository and the commit of a GitHub URL. A field holding several commit URLs run
    together names the one whose commit is ``commit`` (the record's own commit id); without
    it the record is refused: which fix it describes is not said."""
    urls = [u for u in _NEXT_URL.split(url.strip()) if u]
    matches = [_GITHUB.match(u) for u in urls]
    for candidate, match in zip(urls, matches, strict=True):
        if match is None:
            raise ref.error(f"not a GitHub repository or commit URL: {candidate[:120]!r}", field)
    found = [m for m in matches if m is not None]
    if len(found) > 1:
        wanted = (commit or "").lower()
        found = [m for m in found if wanted and (m.group("commit") or "").lower() == wanted]
        if len(found) != 1:
            raise ref.error(
                f"{len(urls)} commit URLs and no commit id that picks one of them", field
            )
    return found[0].group("repo"), found[0].group("commit")


def _cwe(value: Any, ref: RecordRef, field: str) -> str:
    if isinstance(value, list):
        values = [v for v in value if v not in (None, "")]
        if len(values) != 1:
            raise ref.error(f"needs exactly one CWE id, got {values!r}", field)
        value = values[0]
    if value in (None, ""):
        raise ref.error("the record has no CWE label", field)
    try:
        return normalise(value)
    except UnknownCweError as exc:
        raise ref.error(str(exc), field) from None


def _commit(value: str, ref: RecordRef, field: str) -> str:
    if not _SHA.match(value):
        raise ref.error(f"not a commit id: {value[:80]!r}", field)
    return value.lower()


def _language(path: str) -> Language:
    lower = path.lower()
    if lower.endswith(_C_FAMILY):
        return "cpp"
    for suffix, language in _LANGUAGES.items():
        if lower.endswith(suffix):
            return language
    return "other"


def _statement(code: str, where: str) -> str:
    if not code.strip():
        return ""
    if len(code) > MAX_CODE:
        code = code[:MAX_CODE] + "\n[... cut ...]"
    return f"The function under review ({where}):\n\n```\n{code.rstrip()}\n```"


def _flag(value: Any) -> bool | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value)
    return str(value).strip().lower() in ("1", "true", "yes")


def _classify_task(
    ref: RecordRef,
    *,
    prefix: str,
    key: str,
    repo: str,
    base_commit: str,
    cwe: str,
    cve: str | None,
    path: str,
    function: str | None,
    code: str,
    options: ConvertOptions,
    metadata: dict[str, Any],
) -> Task:
    instance_id = f"{prefix}-{key}"
    ref.instance_id = instance_id
    location = None
    if path:
        location = f"{path}::{function}" if function else path
    where = location or "no file named"
    try:
        return Task(
            instance_id=instance_id,
            repo=repo,
            base_commit=base_commit,
            task_type="classify",
            classification=Classification(cwe=cwe, location=location, cve=cve),
            problem_statement=_statement(code, where),
            language=_language(path),
            image=image_for(options, None, instance_id=instance_id, repo=repo, version=None),
            metadata=metadata,
        )
    except ValueError as exc:  # pydantic's ValidationError is one
        raise ref.error(f"not a valid classify task: {exc}") from None


def convert_bigvul(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """A Big-Vul row (vulnerable function) as a classify task."""
    if _flag(record.get("vul")) is False:
        raise ref.error("not a vulnerable function (vul is 0)", "vul")
    cve = text(record, ref, "CVE ID") or None
    cwe = _cwe(record.get("CWE ID"), ref, "CWE ID")
    given = text(record, ref, "commit_id")
    link = text(record, ref, "codeLink", required=True)
    repo, link_commit = _github(link, ref, "codeLink", given)
    fix = given or link_commit or ""
    parent = text(record, ref, "parentID")
    if parent:
        base = _commit(parent, ref, "parentID")
    elif fix:
        base = f"{_commit(fix, ref, 'commit_id')}~1"
    else:
        raise ref.error("neither parentID nor commit_id is given", "parentID")
    code = text(record, ref, "func_before")
    key = text(record, ref, "id") or text(record, ref, "index") or text(record, ref, "Unnamed: 0")
    if not key:
        key = hashlib.sha256(f"{repo}{base}{code}".encode()).hexdigest()[:12]
    return _classify_task(
        ref,
        prefix="bigvul",
        key=key,
        repo=repo,
        base_commit=base,
        cwe=cwe,
        cve=cve,
        path=text(record, ref, "file_name"),
        function=None,
        code=code,
        options=options,
        metadata={"fix_commit": fix or None, "project": text(record, ref, "project") or None},
    )


def convert_cvefixes(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """A CVEfixes method row (its tables joined) as a classify task."""
    if _flag(record.get("before_change")) is False:
        raise ref.error("the method's code after the fix, not the vulnerable one", "before_change")
    cwe = _cwe(record.get("cwe_id"), ref, "cwe_id")
    repo, _ = _github(text(record, ref, "repo_url", required=True), ref, "repo_url")
    fix = _commit(text(record, ref, "hash", required=True), ref, "hash")
    parents = string_list(record, ref, "parents")
    base = _commit(parents[0], ref, "parents") if parents else f"{fix}~1"
    path = text(record, ref, "old_path") or text(record, ref, "filename")
    name = text(record, ref, "name") or None
    key = (
        text(record, ref, "method_change_id")
        or hashlib.sha256(f"{fix}{path}{name}".encode()).hexdigest()[:12]
    )
    return _classify_task(
        ref,
        prefix="cvefixes",
        key=key,
        repo=repo,
        base_commit=base,
        cwe=cwe,
        cve=text(record, ref, "cve_id") or None,
        path=path,
        function=name,
        code=text(record, ref, "code"),
        options=options,
        metadata={"fix_commit": fix},
    )


def convert_primevul(record: Record, ref: RecordRef, options: ConvertOptions) -> Task:
    """A PrimeVul JSONL record (vulnerable function) as a classify task."""
    if _flag(record.get("target")) is False:
        raise ref.error("not a vulnerable function (target is 0)", "target")
    cwe = _cwe(record.get("cwe"), ref, "cwe")
    url = text(record, ref, "commit_url") or text(record, ref, "project_url", required=True)
    repo, link_commit = _github(
        url, ref, "commit_url" if record.get("commit_url") else "project_url"
    )
    fix = _commit(text(record, ref, "commit_id") or link_commit or "", ref, "commit_id")
    cve = record.get("cve")
    file_name = text(record, ref, "file_name")
    return _classify_task(
        ref,
        prefix="primevul",
        key=text(record, ref, "idx", required=True),
        repo=repo,
        base_commit=f"{fix}~1",
        cwe=cwe,
        cve=cve if isinstance(cve, str) and cve else None,
        # PrimeVul names the file, not its path: shown in the statement, not as a location.
        path="",
        function=None,
        code=_statement_prefix(file_name) + text(record, ref, "func"),
        options=options,
        metadata={"fix_commit": fix, "file_name": file_name or None},
    )


def _statement_prefix(file_name: str) -> str:
    return f"// from a file named {file_name}\n" if file_name else ""
