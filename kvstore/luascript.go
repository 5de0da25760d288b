package kvstore

import (
	"embed"
	"io/fs"
	"strings"

	"github.com/redis/go-redis/v9"
)

// scriptFS holds the Redis backends' Lua sources (scripts/*.lua).
//
//go:embed scripts/*.lua
var scriptFS embed.FS

// LuaScript returns a go-redis script whose source is the named files of fsys concatenated in order (shared
// libraries first, the script's own file last). It panics when a file is missing: the sources are
// embedded, so that is a mistake in the build, caught when the package initialises. The Redis backends
// here and package tpu build their scripts with it.
func LuaScript(fsys fs.FS, names ...string) *redis.Script {
	var src strings.Builder
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			panic("kvstore: Lua script source: " + err.Error())
		}
		src.Write(b)
	}
	return redis.NewScript(src.String())
}

// script is LuaScript over this package's scripts directory: script("policy_lib", "policy_seed") is
// scripts/policy_lib.lua followed by scripts/policy_seed.lua.
func script(names ...string) *redis.Script {
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = "scripts/" + n + ".lua"
	}
	return LuaScript(scriptFS, paths...)
}
