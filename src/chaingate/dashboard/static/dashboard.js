// chaingate dashboard: the little script the pages use (the CSP allows no inline script).
// Copy buttons (data-copy="ID" copies the text of #ID) and confirmations before destructive
// forms (data-confirm="question").  Everything works without it, except copying.
"use strict";

function selectText(element) {
  const range = document.createRange();
  range.selectNodeContents(element);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const id = button.getAttribute("data-copy");
  const source = document.getElementById(id);
  const said = document.querySelector(`[data-copied="${id}"]`);
  if (!source) return;
  const done = (text) => { if (said) said.textContent = text; };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(source.textContent.trim()).then(
      () => done("Copied."),
      () => { selectText(source); done("Selected: press Ctrl+C to copy."); },
    );
  } else {
    selectText(source);
    done("Selected: press Ctrl+C to copy.");
  }
});

document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) event.preventDefault();
});
