"""GET /: one small static page for trying the server by hand (`make serve`, then a browser).

For an image classifier (a model with classes.json): pick or drop an image, the page posts its
bytes to /invocations and shows the label and every class's probability. For any other model:
a short notice of how to call it. SageMaker forwards only /ping and /invocations, so on an
endpoint nobody sees this page. Pure: render() returns the HTML.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>serve: __TITLE__</title>
<style>
body { font-family: sans-serif; max-width: 40em; margin: 2em auto; color: #222; }
#drop { border: 2px dashed #888; padding: 2em; text-align: center; }
#drop.over { background: #eef; }
img { max-width: 8em; image-rendering: pixelated; display: block; margin: 1em auto; }
td.bar div { background: #48c; height: 0.8em; }
td { padding: 0.1em 0.5em; }
</style>
</head>
<body>
<h1>__TITLE__</h1>
__BODY__
</body>
</html>
"""

_IMAGE_BODY = """<div id="drop">Drop an image here, or
<input id="file" type="file" accept="image/*"></div>
<img id="preview" alt="">
<p id="status"></p>
<p>Label: <strong id="label"></strong></p>
<table id="probabilities"></table>
<script>
const classes = __CLASSES__;
const drop = document.getElementById("drop");
const statusLine = document.getElementById("status");
async function predict(file) {
  document.getElementById("preview").src = URL.createObjectURL(file);
  statusLine.textContent = "predicting " + file.name + " ...";
  const response = await fetch("/invocations", {
    method: "POST",
    headers: {"Content-Type": file.type || "application/octet-stream"},
    body: file,
  });
  const answer = await response.json();
  if (!response.ok) {
    statusLine.textContent = "error " + response.status + ": " + answer.error;
    return;
  }
  const prediction = answer.predictions[0];
  statusLine.textContent = file.name;
  document.getElementById("label").textContent = prediction.label;
  const table = document.getElementById("probabilities");
  table.replaceChildren();
  prediction.probabilities.forEach((p, i) => {
    const row = table.insertRow();
    row.className = "class";
    row.insertCell().textContent = classes[i];
    row.insertCell().textContent = p.toFixed(4);
    const bar = row.insertCell();
    bar.className = "bar";
    bar.appendChild(document.createElement("div")).style.width = (p * 10) + "em";
  });
}
document.getElementById("file").addEventListener("change", (e) => {
  if (e.target.files.length) predict(e.target.files[0]);
});
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (e.dataTransfer.files.length) predict(e.dataTransfer.files[0]);
});
</script>
"""

_NOTICE_BODY = """<p id="notice">This server answers TensorFlow Serving's REST requests for model
<code>__MODEL__</code> on <code>POST /invocations</code>, e.g.
<code>{"instances": [...]}</code> with <code>Content-Type: application/json</code>.
The image page is for image classifiers (a model with <code>classes.json</code>).</p>
"""


_LISTING_BODY = """<p id="notice">A multi-model endpoint: <code>POST /models</code> loads a model,
<code>POST /models/NAME/invoke</code> calls it, <code>DELETE /models/NAME</code> unloads it.</p>
<table id="models">
<tr><th>model</th><th>versions</th><th>folder</th></tr>
__ROWS__
</table>
"""


def render_listing(models: Sequence[tuple[str, Sequence[int], str]]) -> str:
    """A multi-model endpoint's page: each loaded model's name, versions and folder."""
    rows = "\n".join(
        f'<tr class="model"><td>{html.escape(name)}</td>'
        f"<td>{html.escape(', '.join(str(v) for v in versions))}</td>"
        f"<td><code>{html.escape(url)}</code></td></tr>"
        for name, versions, url in models
    )
    body = _LISTING_BODY.replace("__ROWS__", rows or '<tr><td colspan="3">none loaded</td></tr>')
    return _PAGE.replace("__TITLE__", f"{len(models)} model(s) loaded").replace("__BODY__", body)


def render(model: str | None, classes: Sequence[str] | None, problem: str | None) -> str:
    """The page for the default model; `problem` while loading or if loading failed."""
    if model is None:
        title = "not ready"
        body = f'<p id="notice">{html.escape(problem or "loading")}</p>'
    elif classes is None:
        title = html.escape(model)
        body = _NOTICE_BODY.replace("__MODEL__", html.escape(model))
    else:
        title = html.escape(model)
        # JSON inside <script>: escape '<' so a class name cannot close the element.
        body = _IMAGE_BODY.replace("__CLASSES__", json.dumps(list(classes)).replace("<", "\\u003c"))
    return _PAGE.replace("__TITLE__", title).replace("__BODY__", body)
