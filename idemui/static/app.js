// idemui: the pages work without this. With it, a page that asks to be refreshed (a run that is
// still working) reloads its content in place instead of the whole page, keeping open details
// and the scroll position, and stops once the run has finished.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh") || "0", 10);
  if (!every) { return; }
  function openDetails() {
    var open = {};
    document.querySelectorAll("tr[data-seq] details[open]").forEach(function (d) {
      open[d.closest("tr").getAttribute("data-seq")] = true;
    });
    return open;
  }
  function tick() {
    if (document.hidden) { setTimeout(tick, every * 1000); return; }
    fetch(location.href, { headers: { "Accept": "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var next = doc.getElementById("main");
        if (!next) { return; }
        var open = openDetails();
        document.getElementById("main").replaceWith(next);
        Object.keys(open).forEach(function (seq) {
          var d = document.querySelector('tr[data-seq="' + seq + '"] details');
          if (d) { d.open = true; }
        });
        if (doc.body.getAttribute("data-refresh")) { setTimeout(tick, every * 1000); }
      })
      .catch(function () { setTimeout(tick, every * 4000); });
  }
  setTimeout(tick, every * 1000);
})();
