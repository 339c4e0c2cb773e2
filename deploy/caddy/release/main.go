// The TLS proxy of the compose deployment, built from the Go module proxy at the version go.mod
// pins (scripts/build-caddy.sh; go.sum holds the checksums of every module it is built from).
// The same standard modules as the official caddy image: a main package of its own, as Caddy's
// docs build it, so `caddy version` names the release.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func main() {
	caddycmd.Main()
}
