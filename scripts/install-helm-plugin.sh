#!/bin/sh
# Install ./plugin as the Helm plugin `gemma3-ray`, for Helm 3 and Helm 4, wherever HELM_PLUGINS points.
#
# `helm plugin install ./plugin` links the plugin under its folder's name (`plugin`), and Helm 4
# links it into $HELM_DATA_HOME/plugins whatever HELM_PLUGINS says (helm/helm
# internal/plugin/installer/local_installer.go, LocalInstaller.Path) while it loads plugins from
# HELM_PLUGINS: with HELM_PLUGINS set elsewhere it says "Installed" and then `helm gemma3-ray` is an
# unknown command. This does what `helm plugin install` does for a local directory (a symlink), under
# the plugin's own name, in the first directory Helm loads plugins from; then checks that Helm sees it.
#
#   scripts/install-helm-plugin.sh            # uses $HELM, else helm on PATH
set -eu
helm=${HELM:-helm}
src=$(cd -P "$(dirname "$0")/../plugin" && pwd)
name=gemma3-ray
plugins=$("$helm" env HELM_PLUGINS)
dir=${plugins%%:*}
data=$("$helm" env HELM_DATA_HOME)
mkdir -p "$dir"
# An earlier `helm plugin install ./plugin` left a link named after the folder: the same plugin twice
# would make Helm refuse both.
for old in "$dir/plugin" "$data/plugins/plugin"; do
  if [ -L "$old" ] && [ "$(cd -P "$old" && pwd)" = "$src" ]; then rm "$old"; fi
done
if [ -e "$dir/$name" ] && ! [ -L "$dir/$name" ]; then
  echo "install-helm-plugin: $dir/$name exists and is not a link; remove it (helm plugin uninstall $name) and run again" >&2
  exit 1
fi
ln -sfn "$src" "$dir/$name"
if ! "$helm" plugin list 2>/dev/null | awk 'NR > 1 {print $1}' | grep -qx "$name"; then
  echo "install-helm-plugin: linked $dir/$name but '$helm plugin list' does not show $name" >&2
  exit 1
fi
echo "Installed Helm plugin $name: $dir/$name -> $src (run: helm $name --help)"
