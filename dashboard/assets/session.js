// Dash's callbacks go through window.fetch; two things about their answers matter to the user
// and Dash shows neither:
// - When the dashboard's key stops working (revoked, or the cookie expired), the live updates
//   of an open page are refused with 401 and the page would keep showing its last data without
//   a word: on such a 401, go to the login page, which comes back here after a new login.
// - When the server cannot be reached (stopped, restarting, network gone) or fails, the page
//   froze on its last numbers, which read as a quiet run: a banner says since when the numbers
//   are old, and goes once an update gets through again.
(function () {
  const fetchFirst = window.fetch.bind(window);
  let leaving = false;
  let lostSince = null;

  function showLost(what) {
    if (lostSince === null) lostSince = new Date();
    let banner = document.getElementById("connection-lost");
    if (!banner) {
      banner = document.createElement("div");
      banner.id = "connection-lost";
      banner.className = "banner banner-alert connection-lost";
      banner.setAttribute("role", "alert");
      document.body.prepend(banner);
    }
    banner.textContent =
      // in UTC, as every other time on the dashboard
      what + " since " + lostSince.toISOString().slice(11, 19) + " UTC" +
      ": what this page shows is as of then. Retrying at each refresh.";
  }

  function showFound() {
    lostSince = null;
    const banner = document.getElementById("connection-lost");
    if (banner) banner.remove();
  }

  window.fetch = async function (resource, init) {
    const url = String(typeof resource === "string" ? resource : resource && resource.url);
    const isDash = url.includes("/_dash-");
    let response;
    try {
      response = await fetchFirst(resource, init);
    } catch (error) {
      if (isDash) showLost("No contact with the Vantage server");
      throw error;
    }
    if (!isDash) return response;
    if (response.status === 401 && !leaving) {
      leaving = true;
      const here = window.location.pathname + window.location.search;
      window.location.assign("/dashboard/login?next=" + encodeURIComponent(here) + "&expired=1");
    } else if (response.status >= 500) {
      showLost("The Vantage server fails to update this page (HTTP " + response.status + ")");
    } else {
      showFound();
    }
    return response;
  };
})();
