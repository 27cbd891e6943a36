// Reloads the page every data-refresh seconds (0: never), unless the reader is
// typing in a form. Same-origin and optional: every page works without it.
(function () {
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!(seconds > 0)) {
    return;
  }
  setInterval(function () {
    var active = document.activeElement;
    if (active && (active.tagName === "INPUT" || active.tagName === "SELECT")) {
      return;
    }
    window.location.reload();
  }, seconds * 1000);
})();
